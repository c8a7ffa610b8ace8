"""Import SGLang's kv-canary torch references from the tree :mod:`fetch_sglang` extracted.

Only ``sglang.kernels.ops.kv_canary``'s own modules are executed (``consts``, ``verify``,
``write``, ``plan_ref``, ``write_ref``, ``verify_ref``, ``_dispatch``, and the ``plan``
package, whose Triton offsets kernel runs in Triton's interpreter here). Their parent
packages are empty stand-ins: ``sglang/__init__.py`` would import SGLang's whole runtime
(transformers, FlashInfer, ...), and ``kv_canary/__init__.py`` its kernel registry. The one
other module they import, ``sglang.kernels.jit.utils`` (the CUDA JIT: tvm-ffi, nvcc), is a
stand-in whose ``load_jit`` raises: on the CPU only the references run.

The stand-ins live in ``sys.modules`` only while the references import; afterwards every
``sglang`` entry is removed again (and any that was there before put back), so nothing else
in the test session sees a fake ``sglang``.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any, NamedTuple

PACKAGE = "sglang.kernels.ops.kv_canary"
_MODULES = (
    "consts",
    "verify",
    "write",
    "plan_ref",
    "write_ref",
    "verify_ref",
    "plan.offsets_kernel",
)


class SglangRefs(NamedTuple):
    """SGLang 0.5.23's kv-canary modules and its three torch references."""

    consts: Any
    verify: Any
    """``VerifyPlan``, ``VerifyOrWriteContext``, ``RealKvSource``, ``CanaryLaunchTag``."""
    write: Any
    """``WritePlan``."""
    plan_ref: Any
    """``launch_canary_plan_kernels_torch_reference``."""
    write_ref: Any
    """``launch_canary_write_kernel_torch_reference``."""
    verify_ref: Any
    """``launch_canary_verify_kernel_torch_reference``."""
    plan_offsets: Any
    """``launch_plan_offsets_kernel``: the Triton half of SGLang's plan (write offsets,
    seeds, counts, ``enable``; its entries kernel is CUDA C++)."""
    root: Path


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


def _no_jit(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError(
        "kv-canary tests: SGLang's CUDA JIT is not loaded on the CPU; call the torch references"
    )


def _stub(name: str, path: Path | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []  # a package: submodules import
    module.__file__ = None
    return module


def load_references(root: Path) -> SglangRefs:
    """SGLang's references from ``root`` (the folder holding ``sglang/``)."""
    base = root / "sglang"
    saved = {k: v for k, v in sys.modules.items() if _is_sglang(k)}
    for name in saved:
        del sys.modules[name]
    try:
        stubs = {
            "sglang": base,
            "sglang.kernels": base / "kernels",
            "sglang.kernels.ops": base / "kernels" / "ops",
            PACKAGE: base / "kernels" / "ops" / "kv_canary",
            "sglang.kernels.jit": None,
            "sglang.kernels.jit.utils": None,
        }
        for name, path in stubs.items():
            sys.modules[name] = _stub(name, path)
        jit_utils = sys.modules["sglang.kernels.jit.utils"]
        jit_utils.cache_once = lambda fn: fn  # type: ignore[attr-defined]
        jit_utils.load_jit = _no_jit  # type: ignore[attr-defined]
        jit_utils.make_cpp_args = _no_jit  # type: ignore[attr-defined]
        mods = {name: importlib.import_module(f"{PACKAGE}.{name}") for name in _MODULES}
    finally:
        for name in [k for k in sys.modules if _is_sglang(k)]:
            del sys.modules[name]
        sys.modules.update(saved)
    return SglangRefs(
        consts=mods["consts"],
        verify=mods["verify"],
        write=mods["write"],
        plan_ref=mods["plan_ref"].launch_canary_plan_kernels_torch_reference,
        write_ref=mods["write_ref"].launch_canary_write_kernel_torch_reference,
        verify_ref=mods["verify_ref"].launch_canary_verify_kernel_torch_reference,
        plan_offsets=mods["plan.offsets_kernel"].launch_plan_offsets_kernel,
        root=root,
    )


def as_ops(refs: SglangRefs) -> Any:
    """SGLang's torch references in the place of its CUDA launchers (the same signatures):
    a ``benchmarks.sglang_cuda.SglangOps`` for the CPU smoke tests of the benchmark's
    ``sglang_cuda`` column and of ``run_cuda_differential``."""
    from benchmarks.sglang_cuda import SglangOps

    return SglangOps(
        consts=refs.consts,
        VerifyPlan=refs.verify.VerifyPlan,
        WritePlan=refs.write.WritePlan,
        VerifyOrWriteContext=refs.verify.VerifyOrWriteContext,
        RealKvSource=refs.verify.RealKvSource,
        CanaryLaunchTag=refs.verify.CanaryLaunchTag,
        plan=refs.plan_ref,
        write=refs.write_ref,
        verify=refs.verify_ref,
        plan_max_bs=int(refs.plan_offsets.__globals__["_PLAN_BS_BLOCK_SIZE"]),
        source="SGLang 0.5.23 torch references (CPU stand-ins for its CUDA kernels)",
    )
