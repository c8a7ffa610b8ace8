"""The packages' import graph, read from the sources with ``ast`` (every import, at module
level or inside a function): no module of the four packages imports itself back
through others (no import circle). That ``kv_canary_buffers`` imports nothing above it is
tests/demo/test_layering.py's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kv_canary_buffers", "kv_canary_kernels", "kv_canary_engines", "kv_canary_demo")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (relative imports resolved; ``from x import y``
    counts ``x.y`` when that is a module of the project, else ``x``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = {_module_name(p): p for p in files}
    graph = {}
    for name, path in modules.items():
        if name.endswith("__main__"):
            continue  # a command-line entry, not part of the library's import graph
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def test_no_import_circle():
    graph = _graph()
    assert "kv_canary_kernels.launch" in graph and "kv_canary_buffers.plan" in graph
    # A package's __init__ importing its own modules is not a circle through them.
    edges = {
        m: {t for t in ts if not (m.startswith(t + ".") and t in graph)} for m, ts in graph.items()
    }
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
