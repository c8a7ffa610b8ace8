"""Another revision's packages beside the working tree's, for the probes that compare them
(``kernels_vs_revisions``, ``launchers_vs_revisions``, ``validation_host --baseline`` and
``write_loop_cycles PACKAGE_DIR``).

A revision's ``kv_canary_kernels`` is exported (``git archive``, or copied from a directory
that holds a copy of it) into a package of its own name and imported beside the working
tree's. Its absolute imports of ``kv_canary_buffers`` reach the working tree's package, so
it runs on this tree's owners and validated arguments.

Both layouts load. Revisions from before the layout by stage (bf15e2c) import
``kv_canary_buffers.validation``, which that change split into ``kv_canary_buffers.plan``,
``.write``, ``.verify`` and ``.records``: :func:`alias_old_layout` gives them that module,
made of this tree's stage modules. The change moved code and renamed no argument field,
so an old revision's dispatch reads what this tree's validation builds. (A revision whose
arguments had other fields than this tree's cannot be compared by these probes, in either
layout.)
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

OLD_VALIDATION = "kv_canary_buffers.validation"
"""The module that held every stage's validation before the layout by stage."""

STAGE_MODULES = ("records", "plan", "write", "verify")
"""The modules of ``kv_canary_buffers`` that replaced :data:`OLD_VALIDATION`."""


def alias_old_layout() -> None:
    """Make ``import kv_canary_buffers.validation`` work on a tree of the layout by stage,
    for the kernels of an older revision: a module holding every name of this tree's
    stage modules. Does nothing where ``kv_canary_buffers`` has that module itself (an
    older ``kv_canary_buffers`` first on ``sys.path``), or where the alias is in place."""
    if OLD_VALIDATION in sys.modules or importlib.util.find_spec(OLD_VALIDATION) is not None:
        return
    alias = ModuleType(
        OLD_VALIDATION, "The validation of every stage, as kernels from before bf15e2c import it."
    )
    for stage in STAGE_MODULES:
        module = importlib.import_module(f"kv_canary_buffers.{stage}")
        alias.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    sys.modules[OLD_VALIDATION] = alias


_COMPILED_STUB = '''"""Stand-in for an exported revision's compiled.py (benchmarks/revisions.py)."""


def __getattr__(name):
    raise RuntimeError("kv-canary: an exported revision's kernels are not for torch.compile")
'''


def package_name(rev: str) -> str:
    """The name an exported ``rev`` is imported under."""
    return "kvk_" + "".join(c if c.isalnum() else "_" for c in rev)


def export_kernels(rev: str, into: Path) -> ModuleType:
    """``rev``'s ``kv_canary_kernels`` imported as a package of its own, from ``into``.

    ``rev`` is a git revision of this repository or a directory holding a copy of a
    revision's ``kv_canary_kernels``, or the folder above that copy (where the history is
    not at hand: ``git archive REV kv_canary_kernels | tar -x -C DIR`` gives ``DIR``). The
    copy's ``compiled.py``, which registers the ``kv_canary::*`` operators at import (once
    a process), is replaced by a stand-in: only ``torch.compile``'s tracing reaches it,
    never these probes."""
    name = package_name(rev)
    if Path(rev, "kv_canary_kernels", "write.py").is_file():
        rev = str(Path(rev, "kv_canary_kernels"))  # the folder above the copy, as exported
    if Path(rev, "write.py").is_file():
        shutil.copytree(rev, into / name)
    else:
        data = subprocess.run(
            ["git", "archive", rev, "kv_canary_kernels"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            tar.extractall(into / "_src", filter="data")
        (into / "_src" / "kv_canary_kernels").rename(into / name)
    if (into / name / "compiled.py").is_file():
        (into / name / "compiled.py").write_text(_COMPILED_STUB)
    if str(into) not in sys.path:
        sys.path.insert(0, str(into))
    alias_old_layout()
    return importlib.import_module(name)


def stage_module(package: ModuleType, stage: str) -> ModuleType:
    """``package``'s module of ``stage`` (``"write"`` or ``"verify"``: one module each in
    both layouts, holding its kernel and ``dispatch_<stage>``)."""
    return importlib.import_module(f"{package.__name__}.{stage}")


def load_buffers(directory: str | Path, alias: str) -> ModuleType:
    """The ``kv_canary_buffers`` package found in ``directory``, imported as ``alias``
    beside this tree's (its imports are relative, in both layouts)."""
    init = Path(directory) / "kv_canary_buffers" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        alias, init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


def validators(buffers: ModuleType) -> tuple:
    """``validate_plan_args``, ``validate_verify_args`` and ``validate_write_args`` of a
    ``kv_canary_buffers`` package (this tree's or one from :func:`load_buffers`), in either
    layout: one ``validation`` module before bf15e2c, a module per stage since."""
    base = buffers.__name__
    try:
        old = importlib.import_module(f"{base}.validation")
    except ModuleNotFoundError as err:
        if err.name != f"{base}.validation":
            raise
        stage = {s: importlib.import_module(f"{base}.{s}") for s in ("plan", "verify", "write")}
        return (
            stage["plan"].validate_plan_args,
            stage["verify"].validate_verify_args,
            stage["write"].validate_write_args,
        )
    return old.validate_plan_args, old.validate_verify_args, old.validate_write_args
