"""``python -m kv_canary_buffers``: ``decode FILE`` (see ``decode.py``), else the demo."""

import sys

if sys.argv[1:2] == ["decode"]:
    from .decode import main

    raise SystemExit(main(sys.argv[2:]))

from .demo import run

raise SystemExit(run())
