"""What the write and verify kernels compile to for the H200 (sm_90), checked without a GPU.

Triton's atomics default to ``acq_rel``, which compiles to a ``MEMBAR.GPU`` (wait for every
store in flight) and an L1 invalidate around each atomic: 0.6 us of a 3 us decode write on
the H200. The write and verify kernels' atomics need no ordering, so they are relaxed, as
are the plan's but the one-launch large-batch kernel's sync words (release/acquire, which
order its programs); these tests keep them so. The hash's 64-bit products are inline PTX
on the GPU, a path the interpreter (CI) never runs: its immediates and arithmetic are
checked here in Python integers, and its presence in the compiled kernels. The compile runs
in a subprocess: the test process has the interpreter on.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kv_canary_buffers.layout import SM_MUL1, SM_MUL2, SM_SHIFTS

ROOT = Path(__file__).resolve().parents[2]

_COMPILE = r"""
import json, sys
from benchmarks.sass import compile_sm90
from kv_canary_kernels.verify import canary_verify_kernel
from kv_canary_kernels.write import canary_write_kernel
from kv_canary_kernels.write_split import canary_write_stamp_kernel
from kv_canary_kernels.config import active_launch_config

cfg = active_launch_config()

def ptx(fn, constexprs, warps):
    return compile_sm90(fn, constexprs, warps).asm["ptx"]

out = {}
for expected in (False, True):
    c = {"HAS_EXPECTED": expected, "MODE": 0, "ROWS": 32, "CHUNK": 16}
    out[f"write expected={expected}"] = ptx(canary_write_kernel, c, 1)
c = {"CHECK_TOKENS": True, "MODE": 1, "BLOCK": 128, "CHUNK": 16}
out["verify PARTIAL"] = ptx(canary_verify_kernel, c, 4)
for mode in (0, 1):
    c = {"MODE": mode, "BLOCK": cfg.write_stamp_block, "CHUNK": 16}  # the default's program
    out[f"write stamp MODE={mode}"] = ptx(canary_write_stamp_kernel, c, cfg.write_stamp_warps)
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def ptx_of() -> dict[str, str]:
    # benchmarks/sass.py's compile_sm90: the same typing of the kernels' arguments.
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_kernels_atomics_are_relaxed_with_no_fence(ptx_of):
    assert set(ptx_of) == {
        "write expected=False",
        "write expected=True",
        "verify PARTIAL",
        "write stamp MODE=0",
        "write stamp MODE=1",
    }
    for name, ptx in ptx_of.items():
        atomics = [line for line in ptx.splitlines() if re.search(r"\b(atom|red)\.", line)]
        assert atomics, f"{name}: no atomic found: the check would see nothing"
        for line in atomics:
            assert ".relaxed." in line, f"{name}: {line.strip()}"
        for word in ("membar", "fence.", "acq_rel", ".acquire", ".release"):
            assert word not in ptx, f"{name}: {word} in the PTX"


def test_every_atomic_in_the_kernel_sources_names_relaxed():
    """The plan's kernels too; acquire and release only in large_batch.py, whose programs
    wait for each other through its sync words, and one acq_rel in write_split.py: the
    split write's chain (off the step's critical path) publishes its fill number from the
    last of its programs, after every program read the old one."""
    calls = 0
    acq_rel = 0
    for path in sorted((ROOT / "kv_canary_kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("atomic_")
            ):
                calls += 1
                sem = [k.value for k in node.keywords if k.arg == "sem"]
                assert len(sem) == 1 and isinstance(sem[0], ast.Constant), (
                    f"{path.name}:{node.lineno}: tl.{node.func.attr} without sem="
                )
                # The one-launch plan's workers wait for its scanner: that one word is
                # published (release) and polled (acquire).
                allowed = {
                    "large_batch.py": {"relaxed", "acquire", "release"},
                    "write_split.py": {"relaxed", "acq_rel"},
                }.get(path.name, {"relaxed"})
                assert sem[0].value in allowed, f"{path.name}:{node.lineno}: sem={sem[0].value}"
                acq_rel += sem[0].value == "acq_rel"
    assert calls >= 8
    assert acq_rel == 1


# A string of ``constants``' PTX_HIGH1/2: the high 32 bits of ``x * M`` from the halves of
# ``x`` ($1 low, $2 high), ``mul.hi(lo, M_lo) + mul.lo(lo, M_hi) + mul.lo(hi, M_lo)``.
_PTX_HIGH = re.compile(
    r"mul\.hi\.u32 a, \$1, (0x[0-9A-Fa-f]+); mul\.lo\.u32 b, \$1, (0x[0-9A-Fa-f]+); "
    r"mul\.lo\.u32 c, \$2, (0x[0-9A-Fa-f]+); add\.u32 a, a, b; add\.u32 \$0, a, c;"
)


def _ptx_immediates(text: str) -> tuple[int, int, int]:
    """The immediates of the one ``_PTX_HIGH`` string in ``text``."""
    (found,) = _PTX_HIGH.findall(text)
    return tuple(int(h, 16) for h in found)


def test_ptx_products_immediates_are_the_multipliers_halves():
    """The PTX carries the multipliers' halves and only a GPU runs it (CI never does):
    a wrong digit would change every hash on the GPU alone. Checked here against layout's
    multipliers (and ``sm`` pairing each multiplier with its string), and the PTX's
    arithmetic on the halves against ``x * M`` in integers."""
    from kv_canary_kernels import constants, records

    sm_source = inspect.getsource(records.sm.fn)
    assert "_product_halves(lo, hi, MUL1, PTX_HIGH1)" in sm_source
    assert "_product_halves(lo, hi, MUL2, PTX_HIGH2)" in sm_source
    imm1 = _ptx_immediates(constants.PTX_HIGH1.value)
    imm2 = _ptx_immediates(constants.PTX_HIGH2.value)
    mask = 0xFFFFFFFF
    for (m_lo, m_hi, m_lo2), mul in ((imm1, SM_MUL1), (imm2, SM_MUL2)):
        assert (m_lo, m_hi, m_lo2) == (mul & mask, mul >> 32, mul & mask), hex(mul)

    rng = random.Random(0)
    xs = [0, 1, 2**32 - 1, 2**32, 2**64 - 1] + [rng.getrandbits(64) for _ in range(4000)]
    for x in xs:
        lo, hi = x & mask, x >> 32
        for (m_lo, m_hi, m_lo2), mul in ((imm1, SM_MUL1), (imm2, SM_MUL2)):
            a = (lo * m_lo) >> 32
            b = (lo * m_hi) & mask
            c = (hi * m_lo2) & mask
            low = (lo * m_lo) & mask  # the Triton product: lo * (M & 0xFFFFFFFF), uint32
            assert low | (((a + b + c) & mask) << 32) == (x * mul) % 2**64, (hex(x), hex(mul))
        for shift in SM_SHIFTS:  # _xorshift_halves
            new_lo = lo ^ (((lo >> shift) | (hi << (32 - shift))) & mask)
            new_hi = hi ^ (hi >> shift)
            assert new_lo | (new_hi << 32) == x ^ (x >> shift), (hex(x), shift)


def test_gpu_hash_uses_the_ptx_products_in_the_write_chain_only(ptx_of):
    """The GPU compile takes the PTX path (PTX_PRODUCTS on without the interpreter) in the
    write's serial chain: both multipliers' ``mul.hi`` with their low halves as immediates.
    The verify's hashes, and the split write's stamp's, are independent of each other and
    keep Triton's products (the PTX would cost compile time for no measured gain)."""
    assert set(ptx_of) == {
        "write expected=False",
        "write expected=True",
        "verify PARTIAL",
        "write stamp MODE=0",
        "write stamp MODE=1",
    }
    for name, ptx in ptx_of.items():
        for mul in (SM_MUL1, SM_MUL2):
            imm = f"0x{mul & 0xFFFFFFFF:08X}"
            pattern = rf"mul\.hi\.u32\s[^;]*,\s*{imm};"
            found = re.search(pattern, ptx, re.IGNORECASE) is not None
            chain = name.startswith("write expected")  # the stamp hashes no chain
            assert found == chain, f"{name}: mul.hi.u32 by {imm}: {found}"
