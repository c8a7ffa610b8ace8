"""Regenerate the tables of docs/api.md that are rendered from code: the fields of
``PlanBuffers``, ``CanaryStore`` and ``WriteWorkspace`` (``kv_canary_buffers.layout``)
and the kernels' launch constants (``kv_canary_kernels.config.LaunchConfig``). Each lies between
``<!-- generated: NAME ... -->`` and ``<!-- end generated: NAME -->``; edit the code, then

    .venv/bin/python scripts/api_tables.py          # rewrite docs/api.md
    .venv/bin/python scripts/api_tables.py --check  # exit 1 when it is stale (tests do)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api.md"
_BLOCK = re.compile(
    r"^(<!-- generated: (?P<name>[\w-]+) .*?-->\n)(?P<body>.*?)"
    r"^(<!-- end generated: (?P=name) -->)$",
    re.S | re.M,
)


def blocks() -> dict[str, Callable[[], str]]:
    """Each generated block's name and renderer."""
    sys.path.insert(0, str(ROOT))
    from kv_canary_buffers.layout import PLAN_FIELDS, STORE_FIELDS, WORKSPACE_FIELDS
    from kv_canary_buffers.layout_docs import markdown_field_table
    from kv_canary_kernels.config import launch_config_table

    return {
        "plan-fields": lambda: markdown_field_table(PLAN_FIELDS, "after a plan of `bs` rows"),
        "store-fields": lambda: markdown_field_table(STORE_FIELDS, "contents"),
        "workspace-fields": lambda: markdown_field_table(WORKSPACE_FIELDS, "contents"),
        "launch-config": launch_config_table,
    }


def regenerate(text: str) -> str:
    """``text`` with every generated block rendered anew; a name without a renderer, or
    a renderer without a block, raises ``ValueError``."""
    renderers = blocks()
    seen = set()

    def render(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in renderers:
            raise ValueError(f"docs/api.md: no renderer for the generated block {name!r}")
        seen.add(name)
        return match[1] + renderers[name]() + match[4]

    out = _BLOCK.sub(render, text)
    if seen != set(renderers):
        raise ValueError(f"docs/api.md: missing generated blocks {sorted(set(renderers) - seen)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args(argv)
    text = API.read_text()
    new = regenerate(text)
    if args.check:
        if new != text:
            print("docs/api.md is stale: run python scripts/api_tables.py", file=sys.stderr)
            return 1
        return 0
    API.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
