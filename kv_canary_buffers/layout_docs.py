"""The layout tables rendered as text: reStructuredText for the classes' docstrings,
Markdown for ``docs/api.md`` (``scripts/api_tables.py`` rewrites its generated blocks,
``tests/docs/test_docs.py`` checks them), so that no field's dtype, shape or meaning is written
twice."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from .layout import Field

_CODE = re.compile(r"`([^`]+)`")


def field_rows(fields: Sequence[Field], name_format: str = "{}") -> list[tuple[str, ...]]:
    """``(name, dtype, shape, meaning)`` of each field, in Markdown."""
    return [
        (
            name_format.format(f.name),
            str(f.dtype).removeprefix("torch."),
            f"`[{', '.join(map(str, f.shape))}]`",
            f.meaning,
        )
        for f in fields
    ]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table (no padding: the docs' style)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def markdown_field_table(fields: Sequence[Field], last_header: str) -> str:
    """The table of docs/api.md: one row per field."""
    header = ("field", "dtype", "shape", last_header)
    return markdown_table(header, field_rows(fields, "`{}`"))


def rst_table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int = 92) -> str:
    """A reStructuredText simple table of Markdown cells (single backticks become inline
    literals), the last column wrapped so that a line fits in ``width``."""
    cells = [[_CODE.sub(r"``\1``", c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    last = max(20, width - sum(widths) - 2 * len(widths))
    wrapped = [(row[:-1], textwrap.wrap(row[-1], last, break_on_hyphens=False)) for row in cells]
    last = max(len(line) for _left, lines in wrapped for line in lines)
    rule = "  ".join("=" * w for w in (*widths, last))
    out = [rule]
    for i, (left, lines) in enumerate(wrapped):
        for j, line in enumerate(lines or [""]):
            cols = left if j == 0 else [""] * len(widths)
            out.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)) + "  " + line)
        if i == 0:
            out.append(rule)
    out.append(rule)
    return "\n".join(line.rstrip() for line in out) + "\n"


def docstring_with_fields(doc: str | None, fields: Sequence[Field], last_header: str) -> str | None:
    """``doc`` with its ``{fields}`` line replaced by the field table, indented as that
    line (None under ``python -OO``, which strips docstrings)."""
    if doc is None:
        return None
    table = rst_table(("field", "dtype", "shape", last_header), field_rows(fields))
    match = re.search(r"^( *)\{fields\}\n", doc, re.M)
    if match is None:
        raise AssertionError("kv-canary: internal error: the docstring has no {fields} line")
    return doc[: match.start()] + textwrap.indent(table, match[1]) + doc[match.end() :]
