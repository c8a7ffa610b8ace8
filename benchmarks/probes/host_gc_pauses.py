"""Are the H200 host's slow stretches the garbage collector's pauses?

    python -m benchmarks.probes.host_gc_pauses

Host time per eager call of ``launch_plan``, its bare dispatch and its validation alone,
with Python's garbage collector on, off, on again and with the heap frozen, in one process
(needs CUDA). The plan section's cases of the benchmark (SWA on, the token pool given; 1,
64, 256 and 4096 rows), 9 batches of 100 calls each, median and fastest batch, beside a
heap of 300,000 objects such as a long benchmark process holds, and the number of full
collections during each case.

Last answer (H200, 2026-12-01, before the fields became aliases): no. No batch ran a full
collection, and the collector's state changed nothing beyond the batches' noise: up to
256 rows ``launch_plan`` 24.3 to 35.1 us (fastest batches 23.5 to 25.4), the validation
13.4 to 16.0, the bare dispatch 9.6 to 10.4, in every state; at 4096 rows, 30 s into the
run, every figure 1.5 to 1.8 times higher (the host's own slow state, which
``host_slow_stretches`` measured next).
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-probe-host-gc-20261201.txt``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.harness import logged
from benchmarks.plan_cases import make_batch, verify_entries
from kv_canary_buffers import PlanBuffers, validate_plan_args
from kv_canary_kernels import launch_plan
from kv_canary_kernels.plan import dispatch_plan


def batches(fn: Callable[[], object], calls: int = 100, rounds: int = 9) -> tuple[float, float]:
    """Median and fastest of ``rounds`` batches of ``calls`` calls (us per call), a sync
    after each batch, outside its timing."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out), min(out)


def main() -> int:
    if not torch.cuda.is_available():
        print("host_gc_pauses: needs CUDA")
        return 1
    heap = [[i, str(i)] for i in range(300_000)]
    for bs in (1, 64, 256, 4096):
        kw = make_batch(bs, window=128, pool=True, device="cuda", seed=bs)
        bufs = PlanBuffers.allocate(
            write_req_capacity=bs, verify_capacity=verify_entries(kw), device="cuda"
        )
        args = validate_plan_args(bufs, **kw)
        variants: dict[str, Callable[[], object]] = {
            "launch_plan": lambda: launch_plan(bufs, **kw),
            "bare": lambda: dispatch_plan(bufs, args),
            "validate": lambda: validate_plan_args(bufs, **kw),
        }
        for fn in variants.values():
            fn()
        torch.cuda.synchronize()
        for label in ("gc on", "gc off", "gc on", "frozen"):
            gc.enable()
            gc.unfreeze()
            if label == "gc off":
                gc.disable()
            elif label == "frozen":
                gc.collect()
                gc.freeze()
            full = gc.get_stats()[2]["collections"]
            times = {name: batches(fn) for name, fn in variants.items()}
            full = gc.get_stats()[2]["collections"] - full
            cells = "  ".join(f"{k} {m:6.1f} (min {lo:5.1f})" for k, (m, lo) in times.items())
            print(f"bs={bs:5d} {label:7s} {cells}  gen2 collections {full}", flush=True)
        gc.enable()
        gc.unfreeze()
    del heap
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
