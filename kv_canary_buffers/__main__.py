"""``python -m kv_canary_buffers``: the library's command line.

Its subcommands are :data:`COMMANDS`: ``decode FILE`` (:mod:`.decode`: the rows and
counters of a saved store or a JSON report). Anything else (no arguments, or the
demo's flags) is the engine-loop demo, which moved to its own package: a one-line notice on
stderr, then ``python -m kv_canary_demo`` runs with the same arguments. The demo is named
by a string (``runpy``), so the library's import graph has no arrow up to the demo.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable

from . import decode

DEMO = "kv_canary_demo"

COMMANDS: dict[str, Callable[[list[str]], int]] = {"decode": decode.main}
"""Subcommand name -> its entry, called with the arguments after the name; returns the
exit status."""


def main(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    print(
        f"kv-canary: the demo moved to `python -m {DEMO}`; `python -m kv_canary_buffers` "
        "runs it for now (deprecated)",
        file=sys.stderr,
    )
    # the demo's __main__ raises SystemExit with its status; sys.argv[1:] stays its argv
    runpy.run_module(DEMO, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
