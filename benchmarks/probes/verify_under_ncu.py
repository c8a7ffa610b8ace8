"""Where does the verify kernel spend its time against the traffic-only kernel of the same
case?

    ncu -k regex:"canary_verify_kernel|_verify_traffic_kernel" -c 4 --set full \\
        python -m benchmarks.probes.verify_under_ncu 256 PARTIAL
    python -m benchmarks.probes.verify_under_ncu 256 PARTIAL --time

A target for Nsight Compute: one verify case of the benchmark (``canary_cases.World``,
seed ``bs``, SWA off), ``launch_verify`` and the traffic-only kernel twice each, eagerly.
Arguments: rows (64, 256 or 4096 as in the benchmark; default 256) and real-KV mode (NONE,
PARTIAL or ALL; default PARTIAL). ``--time`` also prints each one's GPU time (a CUDA
graph of 10 calls, median of 30 replays). Needs CUDA (and, for ``ncu``, a GPU that allows
the counters: the device tool's H200 does).

Last answer (H200, 2026-12-01 00:21 UTC, the verify in two round trips): ``--time`` at 256
rows PARTIAL: ``launch_verify`` 7.95 us, the traffic-only kernel 7.15; under ``ncu`` (bs=256
PARTIAL, a6e6727) the kernel issues 2.1 M instructions against the traffic kernel's 0.8
M, at 46 registers, its stalls on the records' and KV bytes' round trip: the contract's
real-KV hash is the difference.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-ncu-verify-bs256-partial-a6e6727-20261201T0018.txt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.canary_baselines import verify_traffic, verify_traffic_grid
from benchmarks.canary_cases import GPU_SIZES, World
from benchmarks.harness import configure, gpu_time, logged
from kv_canary_kernels import launch_verify


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("rows", type=int, nargs="?", default=256)
    parser.add_argument("mode", nargs="?", default="PARTIAL", choices=("NONE", "PARTIAL", "ALL"))
    parser.add_argument("--time", action="store_true")
    args = parser.parse_args(argv)
    configure("cuda", smoke=False)
    world = World(args.rows, GPU_SIZES.prefix, 1, 0, "cuda", seed=args.rows)
    buffers = world.plan()
    real_kv = world.sources(args.mode, GPU_SIZES, seed=args.rows)
    store = world.new_store(real_kv)
    sink = torch.zeros(
        verify_traffic_grid(world.entries, real_kv), dtype=torch.int64, device="cuda"
    )
    calls = {
        "launch_verify": lambda: launch_verify(store, buffers, launch_tag=1, real_kv=real_kv),
        "traffic_only": lambda: verify_traffic(
            store, buffers, world.entries, sink, real_kv=real_kv
        ),
    }
    for call in calls.values():
        call()
        call()
    torch.cuda.synchronize()
    if int(store.violation_count) != 0:
        raise AssertionError("kv-canary: the profiled verify found violations in a clean store")
    if args.time:
        for name, call in calls.items():
            print(f"{name}: {gpu_time(call, 30, 10).us:.2f} us")
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
