"""The one version source: read by both packages' ``__version__``, the CLI's
``--version`` and ``pyproject.toml`` (``[tool.setuptools.dynamic]``)."""

__version__ = "0.2.0"
