"""``python -m kv_canary_buffers``: the engine-loop demo (see ``demo.py``)."""

from .demo import run

raise SystemExit(run())
