"""Every ```python block of the README and docs/ runs on the CPU (the torch references),
in order within its file, sharing one namespace, so that a copied example works. A block
whose first line is ``# engine sketch`` uses an engine's own tensors or a GPU and is only
compiled. The tables rendered from code and the constants the docs quote match the code."""

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SKETCH = "# engine sketch"


def blocks(path):
    return BLOCK.findall(path.read_text())


@pytest.mark.parametrize("path", [p for p in FILES if blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(path):
    namespace = {"__name__": f"docs_{path.stem}"}
    for i, code in enumerate(blocks(path)):
        compiled = compile(code, f"{path.name}[block {i}]", "exec")
        if code.lstrip().startswith(SKETCH):
            continue
        exec(compiled, namespace)


def test_every_doc_block_is_checked():
    runnable = sum(1 for p in FILES for code in blocks(p) if not code.lstrip().startswith(SKETCH))
    assert runnable >= 9  # the user guide's walk-through, at least


def test_generated_api_tables_are_current():
    """docs/api.md's field and launch-constant tables equal their rendering from the code
    (``python scripts/api_tables.py`` rewrites them)."""
    tables = runpy.run_path(str(ROOT / "scripts" / "api_tables.py"))
    text = (ROOT / "docs" / "api.md").read_text()
    assert tables["regenerate"](text) == text, "docs/api.md is stale: run scripts/api_tables.py"


def test_docstring_field_tables_come_from_the_layout():
    from kv_canary_buffers import CanaryStore, PlanBuffers, WriteWorkspace
    from kv_canary_buffers.layout import (
        PLAN_FIELDS,
        ROW_HINT_STRIDE,
        STORE_FIELDS,
        WORKSPACE_FIELDS,
    )

    for cls, fields in (
        (PlanBuffers, PLAN_FIELDS),
        (CanaryStore, STORE_FIELDS),
        (WriteWorkspace, WORKSPACE_FIELDS),
    ):
        doc = cls.__doc__
        assert "{fields}" not in doc
        assert all(re.search(rf"^ +{f.name} ", doc, re.M) for f in fields), cls
    words = " ".join(PlanBuffers.__doc__.split())
    assert f"every {ROW_HINT_STRIDE}th verify entry" in words
    assert f"ceil(Cv / {ROW_HINT_STRIDE})" in words


QUOTED = re.compile(r"`([A-Z][A-Z0-9_]*) = ([-+*() ,0-9A-Fa-fx]+)`")


def test_quoted_constants_match_the_code():
    """A doc quoting a constant as `NAME = value` quotes a value the code gives that name
    (in the layout, an arena, the status flags or the real-KV modes)."""
    from kv_canary_buffers import arena, layout
    from kv_canary_buffers.real_kv import RealKVMode
    from kv_canary_buffers.status import CanaryStatus, FailBits, PlanStatus

    spaces = (layout, arena, CanaryStatus, FailBits, PlanStatus, RealKVMode)
    checked = 0
    for path in FILES:
        for name, text in QUOTED.findall(path.read_text()):
            known = [getattr(space, name) for space in spaces if hasattr(space, name)]
            if known:
                value = eval(text, {"__builtins__": {}})
                assert value in known, f"{path.name}: `{name} = {text}`, the code has {known}"
                checked += 1
    assert checked >= 20
