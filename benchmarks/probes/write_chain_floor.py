"""How fast can the write's hash chain go on this GPU: the chain alone, and the chain with
the memory accesses a prefill write cannot avoid?

    python -m benchmarks.probes.write_chain_floor            # needs CUDA
    python -m benchmarks.probes.write_chain_floor --smoke    # the records checked on the CPU

The chain floor: one lane computing ``running = mix3(running, t, p)`` n times and nothing
else (no loads or stores in the loop), timed in a CUDA graph, with the products as the
write's chain computes them (``LATENCY=True``: inline PTX on NVIDIA GPUs) and as Triton
compiles them (``LATENCY=False``, what the verify uses). A row's chain is serial by
definition (docs/contract-canary.md), so no write kernel can spend less than this per
token on its longest row.

Beside it, the chain with the memory accesses a prefill write cannot avoid
(``chain_traffic_kernel``): per token, its slot, id and position read (two tokens ahead,
as the write does; the loop unrolled by 2: by 3, ptxas tested a token's loads in the body
that issued them, 85 cycles of load waits a token in ``write_loop_cycles``' terms against
4) and its record's four words stored, masked by the slot's sign; no other check, no flag,
no counter. One warp, as the write's program. Between the two floors lies what the loads
and stores cost the chain; above the second, what the write's logic costs. ``--smoke``
runs the traffic kernel on the CPU under the interpreter (``TRITON_INTERPRET=1``, set
when the flag is given) and checks its records against the contract's hash in plain
Python.

Last answer (H200, 2026-12-01 10:00 UTC, 5a7b446, ``scripts/gpu-check.sh``'s canary
part): the chain alone 92.6 ns a ``mix3`` with the PTX products (758.6 us for 8192, 191.6
for 2048), 104.1 ns with Triton's (853.1 us for 8192); the chain with its unavoidable
traffic 256.7 us for 16 x 2048 and 946.5 us for 1 x 8192, against the write's 226 and 900
us (docs/performance.md, the write split).
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-canary-tests-5a7b446-20261201.log``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import triton
import triton.language as tl

from benchmarks.harness import configure, gpu_time, logged
from kv_canary_kernels.constants import (
    ANCHOR,
    REC_POSITION,
    REC_PREV_HASH,
    REC_REAL_KV,
    REC_TOKEN,
    REC_W,
)
from kv_canary_kernels.records import mix3
from kv_canary_kernels.write import _load_token


@triton.jit
def chain_kernel(ids_ptr, pos_ptr, out_ptr, n, LATENCY: tl.constexpr):
    running = tl.full([32], ANCHOR, tl.uint64)
    lanes = tl.arange(0, 32)
    t = tl.load(ids_ptr + lanes)
    p = tl.load(pos_ptr + lanes)
    for _ in range(n):
        running = mix3(running, t, p, LATENCY)
    tl.store(out_ptr + lanes, running.to(tl.int64, bitcast=True))


@triton.jit
def chain_traffic_kernel(ids_ptr, pos_ptr, ocl_ptr, records_ptr, rows, length: tl.int64):
    """Row ``r`` (one a lane, ``rows <= 32``) is tokens ``[r * length, (r + 1) * length)``,
    chained from H0, each record stored at its slot: the write's first walk without its
    checks, flags and counters (a token past the row's end loads as NO_SLOT and is
    skipped, as there)."""
    lanes = tl.arange(0, 32)
    live = lanes < rows
    first = lanes.to(tl.int64) * length
    running = tl.full([32], ANCHOR, tl.uint64)
    # The write's own token loads, without expected inputs (their pointers unused).
    s0, t0, p0, _, _ = _load_token(
        ocl_ptr, ids_ptr, pos_ptr, 0, 0, first, live & (length > 0), False
    )
    s1, t1, p1, _, _ = _load_token(
        ocl_ptr, ids_ptr, pos_ptr, 0, 0, first + 1, live & (length > 1), False
    )
    for step in tl.range(0, length, loop_unroll_factor=2):
        s2, t2, p2, _, _ = _load_token(
            ocl_ptr, ids_ptr, pos_ptr, 0, 0, first + step + 2, live & (length > step + 2), False
        )
        ok = s0 >= 0
        chain = running.to(tl.int64, bitcast=True)
        running = tl.where(ok, mix3(running, t0, p0, True), running)
        rec = records_ptr + s0 * REC_W
        tl.store(rec + REC_TOKEN, t0, mask=ok)
        tl.store(rec + REC_POSITION, p0, mask=ok)
        tl.store(rec + REC_PREV_HASH, chain, mask=ok)
        tl.store(rec + REC_REAL_KV, tl.zeros_like(chain), mask=ok)
        s0, t0, p0 = s1, t1, p1
        s1, t1, p1 = s2, t2, p2


def traffic_case(rows: int, length: int, device: str):
    """Inputs of ``rows`` rows of ``length`` tokens, slots a permutation, and the records."""
    g = torch.Generator().manual_seed(rows * length)
    n = rows * length
    ids = torch.randint(0, 50000, (n,), generator=g).to(device)
    pos = (torch.arange(n) % length + 1).to(device)
    ocl = torch.randperm(n, generator=g).to(device)
    return ids, pos, ocl, torch.zeros(n, 4, dtype=torch.int64, device=device)


def smoke() -> int:
    """The traffic kernel's records against the contract's chain, under the interpreter."""
    from kv_canary_buffers.hashing import H0_SIGNED, mix3_int

    rows, length = 3, 5
    ids, pos, ocl, records = traffic_case(rows, length, "cpu")
    chain_traffic_kernel[(1,)](ids, pos, ocl, records, rows, length)
    for r in range(rows):
        h = H0_SIGNED
        for i in range(r * length, (r + 1) * length):
            want = [int(ids[i]), int(pos[i]), h, 0]
            assert records[int(ocl[i])].tolist() == want, (r, i)
            h = mix3_int(h, int(ids[i]), int(pos[i]))
    print("write_chain_floor --smoke: the traffic kernel's records follow the contract's chain")
    return 0


def main(argv: list[str] | None = None) -> int:
    if (argv if argv is not None else sys.argv[1:]) == ["--smoke"]:
        return smoke()
    if not torch.cuda.is_available():
        print("write_chain_floor: needs CUDA (or --smoke under TRITON_INTERPRET=1)")
        return 1
    configure("cuda", smoke=False)  # without it gpu_time times eager calls on the host
    x = torch.arange(32, device="cuda")
    out = torch.zeros(32, dtype=torch.int64, device="cuda")
    results = {}
    for latency, name in ((True, "PTX products (the write's chain)"), (False, "Triton's products")):
        for n in (2048, 8192):
            # A CUDA graph of 2 calls (each over 2 ms), median of 20 replays: as measured.
            go = lambda: chain_kernel[(1,)](x, x, out, n, latency, num_warps=1)  # noqa: E731
            t = gpu_time(go, 20, 2).us
            results[latency, n] = out.clone()
            print(f"chain floor, {name}: {n} mix3 in {t:8.1f} us = {t * 1e3 / n:6.1f} ns per mix3")
    for n in (2048, 8192):
        assert torch.equal(results[True, n], results[False, n]), "the two products differ"
    for rows, length in ((16, 2048), (1, 8192)):
        ids, pos, ocl, records = traffic_case(rows, length, "cuda")
        go = lambda: chain_traffic_kernel[(1,)](  # noqa: E731
            ids, pos, ocl, records, rows, length, num_warps=1
        )
        t = gpu_time(go, 20, 2).us
        print(
            f"chain + traffic floor: {rows} x {length} in {t:8.1f} us = "
            f"{t * 1e3 / length:6.1f} ns a token"
        )
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
