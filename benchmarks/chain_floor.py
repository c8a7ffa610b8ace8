"""The write's hash-chain floor: one lane computing ``running = mix3(running, t, p)`` n
times and nothing else (no loads or stores in the loop), timed in a CUDA graph, with the
products as the write's chain computes them (``LATENCY=True``: inline PTX on NVIDIA GPUs)
and as Triton compiles them (``LATENCY=False``, what the verify uses).

    PYTHONPATH=. python benchmarks/chain_floor.py

A row's chain is serial by definition (docs/contract-canary.md), so no write kernel can
spend less than this per token on its longest row. Measured on the H200 in the sessions of
2026-11-30 and 2026-12-01: 104 ns per mix3 with Triton's products, 92 ns with the PTX ones
(benchmarks/results/h200-write-loop-20261201.txt).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import configure, gpu_time
from kv_canary_kernels.canary_common import mix3
from kv_canary_kernels.constants import ANCHOR


@triton.jit
def chain_kernel(ids_ptr, pos_ptr, out_ptr, n, LATENCY: tl.constexpr):
    running = tl.full([32], ANCHOR, tl.uint64)
    lanes = tl.arange(0, 32)
    t = tl.load(ids_ptr + lanes)
    p = tl.load(pos_ptr + lanes)
    for _ in range(n):
        running = mix3(running, t, p, LATENCY)
    tl.store(out_ptr + lanes, running.to(tl.int64, bitcast=True))


def main() -> int:
    if not torch.cuda.is_available():
        print("chain_floor: needs CUDA")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
