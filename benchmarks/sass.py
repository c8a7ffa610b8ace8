"""sm_90 machine code of this project's kernels on any machine, without a GPU: compile a
``@triton.jit`` kernel for the H200 with Triton's own ptxas, disassemble it with Triton's
cuobjdump, and read each instruction's scheduling bits. Used by the write-loop model
(``benchmarks.probes.write_loop_cycles``), ``tests/launch/test_kernel_asm.py`` and
``scripts/sass_digest.py``.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

_INT32 = {
    "write_num_valid_reqs_ptr",
    "chain_position_check_ptr",
    "verify_num_valid_ptr",
    "verify_enable_ptr",
    "status_ptr",
    # the same parameters in older copies of the package
    "num_rows_ptr",
    "check_ptr",
    "num_valid_ptr",
    "enable_ptr",
}
"""The kernels' int32 pointer arguments (flags, counts, status words), by name."""


def cuobjdump() -> str:
    """Triton's bundled cuobjdump (the same toolkit as its ptxas)."""
    import triton.backends.nvidia as nvidia

    return str(Path(nvidia.__file__).parent / "bin" / "cuobjdump")


def compile_sm90(fn: Any, constexprs: dict[str, Any], num_warps: int) -> Any:
    """``fn`` (a ``@triton.jit`` kernel of this project) compiled for sm_90 on any machine:
    its pointers typed by name (``src*`` bf16, the int32 flags and counts, the rest int64)
    and 16-byte aligned, as the launchers pass them; ``.asm`` holds its PTX and cubin."""
    import triton
    from triton.backends.compiler import GPUTarget

    sig = {}
    for name, p in inspect.signature(fn.fn).parameters.items():
        ann = str(p.annotation)
        if "constexpr" in ann:
            sig[name] = "constexpr"
        elif "int64" in ann:
            sig[name] = "i64"
        elif name.startswith("src"):
            sig[name] = "*bf16"
        else:
            sig[name] = "*i32" if name in _INT32 else "*i64"
    attrs = {(i,): [["tt.divisibility", 16]] for i, v in enumerate(sig.values()) if v[0] == "*"}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def instructions(cubin: bytes) -> list[dict]:
    """Address, stall cycles, write barrier, wait mask and text of each instruction."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(
            [cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    lines = sass.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* (0x[0-9a-f]+) \*/", line)
        if not m:
            continue
        high = re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1])
        assert high, f"no second word after {line!r}"
        word = (int(high.group(1), 16) << 64) | int(m.group(3), 16)
        out.append(
            {
                "address": int(m.group(1), 16),
                "stall": (word >> 105) & 0xF,
                "write_barrier": (word >> 110) & 7,
                "wait_mask": (word >> 116) & 0x3F,
                "text": re.sub(r"\s+", " ", m.group(2).strip()),
            }
        )
    return out
