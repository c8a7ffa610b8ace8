"""Every ```python block of the README and docs/ runs on the CPU (the torch references),
in order within its file, sharing one namespace, so that a copied example works. A block
whose first line is ``# engine sketch`` uses an engine's own tensors or a GPU and is only
compiled."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
