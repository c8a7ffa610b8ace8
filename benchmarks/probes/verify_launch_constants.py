"""Which verify launch constants are fastest on the benchmark's verify cases?

    python -m benchmarks.probes.verify_launch_constants

One field of the ``LaunchConfig`` changed at a time (block, warps, programs an SM), rounds
interleaved, GPU time per call in a CUDA graph of 10 calls (median of the rounds'
medians), on the benchmark's verify cases (64, 256 and 4096 rows, real-KV NONE and
PARTIAL; needs CUDA). Every store is checked clean afterwards.

Last answer (H200, 2026-11-30 17:12 UTC, the verify of then): the defaults (128-entry
blocks, 4 warps, 16 programs an SM) are the fastest or within noise everywhere; nothing
went below 8.3 us at 256 rows PARTIAL (defaults 8.42; 256-entry blocks of 8 warps 8.32,
slower elsewhere), where changing the block or the warps alone was 1.2 to 2.3x slower.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-sweep-verify-constants-20261130T1712.txt``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.canary_cases import GPU_SIZES, World
from benchmarks.harness import configure, gpu_time, logged
from kv_canary_kernels import launch_verify
from kv_canary_kernels.config import launch_config

CONFIGS: list[dict[str, int]] = [
    {},
    {"verify_block": 256},
    {"verify_block": 64},
    {"verify_warps": 2},
    {"verify_warps": 8},
    {"verify_programs_per_sm": 8},
    {"verify_programs_per_sm": 32},
    {"verify_block": 64, "verify_warps": 2},
    {"verify_block": 256, "verify_warps": 8},
    {"verify_programs_per_sm": 24},
]


def main() -> int:
    configure("cuda", False)
    cases = []
    for bs in (64, 256, 4096):
        world = World(bs, GPU_SIZES.prefix, 1, 0, "cuda", seed=bs)
        plan = world.plan()
        for mode in ("NONE", "PARTIAL"):
            real_kv = world.sources(mode, GPU_SIZES, seed=bs)
            cases.append((f"bs={bs} {mode}", world.new_store(real_kv), plan, real_kv))
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(3):
        for i, changes in enumerate(CONFIGS):
            with launch_config(**changes):
                for name, store, plan, real_kv in cases:

                    def verify(store=store, plan=plan, real_kv=real_kv) -> None:
                        launch_verify(store, plan, real_kv=real_kv)

                    times.setdefault((i, name), []).append(gpu_time(verify, 30).us)
    for name, *_ in cases:
        row = " ".join(f"{statistics.median(times[(i, name)]):7.2f}" for i in range(len(CONFIGS)))
        print(f"{name:16s} {row}")
    print("configs:", [str(c) for c in CONFIGS])
    torch.cuda.synchronize()
    for name, store, _plan, _real_kv in cases:
        assert store.take_violations().appended == 0, name
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
