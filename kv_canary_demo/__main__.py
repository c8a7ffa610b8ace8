"""``python -m kv_canary_demo``: the engine-loop demo (see ``cli.py``)."""

from .cli import run

raise SystemExit(run())
