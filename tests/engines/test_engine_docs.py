"""The ```python blocks of the runtime's and the transformers adapter's pages run (CPU,
torch references), in order within a page, sharing one namespace; a block whose first
line is ``# engine sketch`` needs an engine's objects and is only compiled."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "engines"
PAGES = ["runtime.md", "transformers.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page):
    blocks = BLOCK.findall((DOCS / page).read_text())
    assert blocks
    namespace = {"__name__": f"docs_engines_{page[:-3]}"}
    for i, code in enumerate(blocks):
        compiled = compile(code, f"{page}[block {i}]", "exec")
        if not code.lstrip().startswith("# engine sketch"):
            exec(compiled, namespace)


def test_the_runtime_page_runs_an_engine_loop():
    text = (DOCS / "runtime.md").read_text()
    assert any(not b.lstrip().startswith("# engine sketch") for b in BLOCK.findall(text))
