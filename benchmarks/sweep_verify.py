"""Verify launch constants on the benchmark's verify cases (H200): one field of the
``LaunchConfig`` changed at a time, rounds interleaved, GPU time per call in a CUDA graph of
10 calls (median of the rounds' medians). Every store is checked clean afterwards.

    PYTHONPATH=. python benchmarks/sweep_verify.py
"""

from __future__ import annotations

import statistics

import torch

from canary_cases import GPU_SIZES, World
from harness import configure, gpu_time
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
    raise SystemExit(main())
