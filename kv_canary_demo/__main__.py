"""``python -m kv_canary_demo``: the engine-loop demo (see ``cli.py``)."""

try:
    from .cli import run
except ModuleNotFoundError as err:  # the demo extra is not installed
    if err.name != "rich":
        raise
    raise SystemExit(
        "kv-canary demo: error: the demo needs rich: pip install 'kv-canary-buffers[demo]'"
    ) from None

raise SystemExit(run())
