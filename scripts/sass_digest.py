"""Digest of every kernel's sm_90 SASS, without a GPU: what a change that must not change the
generated code (a move, a rename, a refactor of the host side) is checked with.

    python scripts/sass_digest.py [--dump DIR]          # in each tree; compare the outputs

Compiles each ``@triton.jit`` kernel of ``kv_canary_kernels`` (the working tree's, or the one
first on ``PYTHONPATH``) in a few variants for sm_90 with Triton's own ptxas (pointers typed
by parameter name and 16-byte aligned, runtime ints int32 unless annotated ``tl.int64``) and
prints one line per variant: its name and the SHA-256 of its disassembly with addresses and
the kernel's symbol name dropped. Two trees whose lines are equal generate the
same machine code. ``--dump DIR`` also writes each disassembly, for a diff.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PLAN = {"HAS_LUT": True, "HAS_POOL": True, "VERIFY": True, "TABLE": 0}
"""(Constexprs a tree's kernel does not take are dropped: older trees compile too.)"""
VARIANTS: list[tuple[str, str, str, dict[str, Any], int]] = [
    # (name, module, kernel, constexprs, warps)
    (
        "plan small",
        "plan.small_batch",
        "plan_small_batch_kernel",
        {**PLAN, "ROWS": 256, "BLOCK": 256},
        8,
    ),
    (
        "plan large",
        "plan.large_batch",
        "plan_large_batch_kernel",
        {
            **PLAN,
            "BLOCK": 1024,
            "CHUNK_ROWS": 1024,
            "ROW_WINDOW": 32,
            "HINT_STRIDE": 16,
            "MAX_POLLS": 1 << 20,
        },
        8,
    ),
    (
        "plan sums",
        "plan.offsets",
        "scan_block_sums_kernel",
        {"BLOCK": 1024, "USE_PDL": True, "VERIFY": True},
        8,
    ),
    (
        "plan offsets",
        "plan.offsets",
        "plan_offsets_kernel",
        {"BLOCK": 1024, "SUM_CHUNK": 1024, "HINT_STRIDE": 16, "USE_PDL": True, "VERIFY": True},
        8,
    ),
    (
        "plan entries",
        "plan.entries",
        "plan_entries_kernel",
        {**PLAN, "BLOCK": 1024, "ROW_WINDOW": 32, "HINT_STRIDE": 16, "USE_PDL": True},
        8,
    ),
    *(
        (f"plan {path} {what}", module, kernel, {**constexprs, **extra}, 8)
        for what, extra in (
            ("write-only", {"VERIFY": False}),
            ("block table pow2", {"TABLE": 1}),
            ("block table", {"TABLE": 2}),
        )
        for path, module, kernel, constexprs in (
            (
                "small",
                "plan.small_batch",
                "plan_small_batch_kernel",
                {**PLAN, "ROWS": 256, "BLOCK": 256},
            ),
            (
                "entries",
                "plan.entries",
                "plan_entries_kernel",
                {**PLAN, "BLOCK": 1024, "ROW_WINDOW": 32, "HINT_STRIDE": 16, "USE_PDL": True},
            ),
        )
        if what != "write-only" or path == "small"
    ),
    # (NUM_SOURCES: the kernels' constexpr before the real-KV source table; a tree since
    # takes the sources at run time and drops it, below, but keeps these names)
    *(
        (
            f"write expected={e} sources={n} mode={m}",
            "write",
            "canary_write_kernel",
            {
                "HAS_EXPECTED": e,
                "NUM_SOURCES": n,
                "MODE": m,
                "ROWS": 32,
                "CHUNK": 16,
                "CHAIN_UNROLL": 2 if e else 4,
            },
            1,
        )
        # mode 3: PARTIAL over more than two sources, four a step (a tree from before the
        # source table compiles it as ALL: not comparable with one since)
        for e, n, m in ((False, 0, 0), (True, 0, 0), (False, 2, 1), (False, 8, 3), (True, 4, 2))
    ),
    *(
        (
            f"verify tokens={t} sources={n} mode={m}",
            "verify",
            "canary_verify_kernel",
            {"CHECK_TOKENS": t, "NUM_SOURCES": n, "MODE": m, "BLOCK": 128, "CHUNK": 16},
            4,
        )
        for t, n, m in ((True, 0, 0), (False, 2, 1), (False, 8, 3), (True, 4, 2))
    ),
    # the split write (a tree before it has no write_split module: its lines are absent)
    *(
        (
            f"write chain expected={e}",
            "write_split",
            "canary_write_chain_kernel",
            {"HAS_EXPECTED": e, "ROWS": 32, "UNROLL": 2 if e else 4, "SLEEP_NS": 0},
            1,
        )
        for e in (False, True)
    ),
    (  # the walk with a sleep after each token (a tree without the constant: the same line)
        "write chain expected=True sleep=256",
        "write_split",
        "canary_write_chain_kernel",
        {"HAS_EXPECTED": True, "ROWS": 32, "UNROLL": 2, "SLEEP_NS": 256},
        1,
    ),
    # the stamp's programs: 128 tokens in four warps (the default until 6ed04f9, kept so
    # that older trees compare) and the default's 32 in one
    *(
        (
            f"write stamp mode={m}" + ("" if block == 128 else f" block={block}"),
            "write_split",
            "canary_write_stamp_kernel",
            {"MODE": m, "BLOCK": block, "CHUNK": 16},
            warps,
        )
        for block, warps in ((128, 4), (32, 1))
        for m in (0, 1, 3, 2)
    ),
]


_INT32_POINTERS = {
    # the int32 fields (kv_canary_buffers.layout) and inputs, by their kernel parameters'
    # names: `<field>_ptr` ...
    "req_to_token_ptr",
    "block_table_ptr",
    "req_to_verify_expected_tokens_ptr",
    "write_num_valid_reqs_ptr",
    "verify_num_valid_ptr",
    "verify_enable_ptr",
    "verify_row_hints_ptr",
    "chain_position_check_ptr",
    "status_ptr",
    "last_token_ptr",
    # ... and as trees before that naming called them
    "token_pool_ptr",
    "num_rows_ptr",
    "num_valid_ptr",
    "enable_ptr",
    "check_ptr",
    "row_hints_ptr",
}
"""Pointer parameters compiled as int32 (the rest int64, ``src*`` bf16), as the launchers
pass them: each int32 field's and input's parameter, under its name in this tree and in
older ones, so that every tree is compiled with the same types."""


def _compile(fn: Any, constexprs: dict[str, Any], num_warps: int) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget

    sig = {}
    for name, p in inspect.signature(fn.fn).parameters.items():
        ann = str(p.annotation)
        if "constexpr" in ann:
            sig[name] = "constexpr"
        elif "int64" in ann:
            sig[name] = "i64"
        elif not name.endswith("_ptr") and not name.startswith("src"):
            sig[name] = "i32"  # a runtime int that fits in int32, as launches pass most
        elif name.startswith("src"):
            sig[name] = "*bf16"
        else:
            sig[name] = "*i32" if name in _INT32_POINTERS else "*i64"
    attrs = {(i,): [["tt.divisibility", 16]] for i, v in enumerate(sig.values()) if v[0] == "*"}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _sass(cubin: bytes) -> str:
    try:
        from benchmarks.sass import cuobjdump
    except ModuleNotFoundError:  # a tree from before benchmarks/ was a package
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from sass_model import cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    text = []
    for line in out.splitlines():
        if "Function :" in line or ".text." in line:
            continue  # the kernel's symbol (the module path may be part of it)
        text.append(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).rstrip())
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, help="write each variant's SASS into this folder")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"
    sys.path.append(str(ROOT))  # benchmarks.sass; the kernels first on PYTHONPATH stay first
    for name, module, kernel, constexprs, warps in VARIANTS:
        try:
            mod = importlib.import_module(f"kv_canary_kernels.{module}")
        except ModuleNotFoundError:  # a tree from before the plan's kernels had a folder
            try:
                mod = importlib.import_module(f"kv_canary_kernels.{module.rsplit('.', 1)[-1]}")
            except ModuleNotFoundError:  # a tree from before the kernel existed
                continue
        fn = getattr(mod, kernel)
        constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
        sass = _sass(_compile(fn, constexprs, warps).asm["cubin"])
        print(f"{hashlib.sha256(sass.encode()).hexdigest()[:16]}  {name}")
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / (re.sub(r"\W+", "_", name) + ".sass")).write_text(sass)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
