"""The demo on its own floor: ``kv_canary_demo`` sits above both packages and uses them by
their public top-level names only; neither package imports it (nor rich), the torch
package never imports the kernels, and ``python -m kv_canary_buffers`` still runs the demo
behind a one-line deprecation notice."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kv_canary_buffers
import kv_canary_demo
import kv_canary_kernels

SMALL = ["--steps", "6", "--max-batch", "8", "--max-seq-len", "64", "--stages", "reference"]


def package_dir(package) -> Path:
    return Path(package.__file__).parent


def imports(path: Path, root: Path) -> list[tuple[str, list[str], int]]:
    """Every import statement of the module at ``path`` in the package folder ``root``, at
    any depth (function bodies included): the module named (made absolute), the names
    taken, the line."""
    package = list(path.parent.relative_to(root.parent).parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolved against the module's package
                base = package[: len(package) - (node.level - 1)]
                assert base, f"{path.name}:{node.lineno}: a relative import above the package"
                module = ".".join(base + ([module] if module else []))
            found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


def modules_of(package) -> list[tuple[Path, list[tuple[str, list[str], int]]]]:
    """``(path, its imports)`` of every module of ``package``, subpackages included."""
    root = package_dir(package)
    paths = sorted(root.rglob("*.py"))
    assert paths
    return [(path, imports(path, root)) for path in paths]


def test_importing_both_packages_does_not_import_rich():
    code = (
        "import kv_canary_buffers, kv_canary_kernels, sys; "
        "assert 'rich' not in sys.modules, 'rich was imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_importing_the_demo_package_loads_rich_only_with_its_cli():
    code = (
        "import kv_canary_demo, sys; print('rich' in sys.modules); "
        "import kv_canary_demo.cli; print('rich' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "False\nTrue\n"


@pytest.mark.parametrize(
    "package", [kv_canary_buffers, kv_canary_kernels], ids=lambda p: p.__name__
)
def test_no_module_of_the_library_imports_upward_or_rich(package):
    """No static arrow from the torch package to the kernels, and none from either
    package to the demo or to rich (``kv_canary_buffers.__main__`` names the demo in a
    string for ``runpy``, outside the import graph)."""
    above = {"kv_canary_demo", "rich"}
    if package is kv_canary_buffers:
        above.add("kv_canary_kernels")
    checked = 0
    for path, found in modules_of(package):
        for module, _names, line in found:
            assert module.split(".")[0] not in above, f"{path.name}:{line} imports {module}"
            checked += 1
    assert checked > 20


def test_the_demo_uses_the_library_by_its_public_names_only():
    """Only ``from kv_canary_buffers import <public name>`` (and the same for the kernels):
    the library's internal modules can be renamed under the demo."""
    public = {
        "kv_canary_buffers": set(kv_canary_buffers.__all__),
        "kv_canary_kernels": set(kv_canary_kernels.__all__),
    }
    seen = set()
    for path, found in modules_of(kv_canary_demo):
        for module, names, line in found:
            root = module.split(".")[0]
            if root in public:
                where = f"{path.name}:{line}"
                assert module == root and names, f"{where}: {module} is not a top-level import"
                assert set(names) <= public[root], f"{where}: {set(names) - public[root]}"
                seen.add(root)
            elif root == "rich":
                assert path.name == "cli.py", f"{path.name}:{line} imports rich"
    assert seen == set(public)


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=120
    )


TIMING = re.compile(r"^timing: .*$", re.MULTILINE)


def test_the_old_entry_prints_a_notice_and_runs_the_demo():
    old = run_module("kv_canary_buffers", *SMALL)
    new = run_module("kv_canary_demo", *SMALL)
    assert old.returncode == new.returncode == 0, old.stderr
    (notice,) = old.stderr.splitlines()
    assert notice.startswith("kv-canary: ") and "python -m kv_canary_demo" in notice
    assert new.stderr == ""
    # the same run, line for line, apart from what is timed
    assert TIMING.sub("", old.stdout) == TIMING.sub("", new.stdout)
    assert old.stdout.rstrip().endswith(
        "result: OK: 0 violations, every plan equal to plan_reference"
    )


def test_the_old_entry_passes_the_demo_its_exit_status_and_flags():
    old = run_module("kv_canary_buffers", "--steps", "0")
    assert old.returncode == 2
    assert old.stderr.splitlines()[1:] == [
        "kv-canary demo: error: --steps and --max-batch must be >= 1"
    ]
    version = run_module("kv_canary_buffers", "--version")
    assert version.returncode == 0
    assert version.stdout == f"kv-canary-buffers {kv_canary_buffers.__version__}\n"


def test_the_demo_without_rich_says_which_extra_to_install():
    code = (
        "import runpy, sys\n"
        "sys.modules['rich'] = None  # as if rich were not installed\n"
        "runpy.run_module('kv_canary_demo', run_name='__main__')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr == (
        "kv-canary demo: error: the demo needs rich: pip install 'kv-canary-buffers[demo]'\n"
    )
