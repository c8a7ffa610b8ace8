"""What does ``torch.compile`` add to the host time of a canary step?

    python -m benchmarks.probes.compiled_step_host [--device cpu|cuda] [--rounds 7]

Host time of one canary step (plan + verify + write, 256 rows) called eagerly and as a
function compiled with ``torch.compile(fullgraph=True)`` (inductor), without CUDA graphs:
what the compiled path adds on the host (dynamo's guards, AOTAutograd's and inductor's
wrappers, the operators' dispatch) on top of the launchers' validation. On the CPU the
kernels' launches are stubbed out (nothing runs on a device: host work only); on CUDA they
run, and every round ends with a sync.

Last answer (H200, 2026-12-01 05:03 UTC, ``scripts/gpu-check.sh``'s compile part on
5dc98fc's tree): eager 98.8 us, compiled 251.1 us per step; across the runs of 2026-11-30
and 2026-12-01, compiled 154 to 442 us against eager 56 to 190 us, about 2.5x. Inside a
compiled function use CUDA graphs, where none of it runs (user guide).
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-gpu-check-tests-demo-compile-20261201T0503.log``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import kv_canary_kernels.compiled as compiled_module
import kv_canary_kernels.launch as launch_module
from benchmarks.harness import logged
from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV, RealKVMode
from kv_canary_kernels import launch_plan, launch_verify, launch_write


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cpu":
        # The eager launchers (kv_canary_kernels.launch) and the operators' implementations
        # (kv_canary_kernels.compiled) call these: host work only.
        for module in (launch_module, compiled_module):
            module.dispatch_plan = lambda *a: None
            module.dispatch_write = lambda *a: None
            module.dispatch_verify = lambda *a: None
    bs = 256
    plan = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 16, device=dev)
    store = CanaryStore.allocate(num_slots=bs * 32, violation_capacity=64, device=dev)
    kv = torch.zeros(bs * 32, 8, dtype=torch.int64, device=dev)
    real_kv = RealKV(mode=RealKVMode.PARTIAL, sources=(kv,), page_size=1, bytes_per_token=64)
    rows = torch.arange(1, bs + 1, device=dev)
    prefix = torch.full((bs,), 8, dtype=torch.int64, device=dev)
    ones = torch.ones(bs, dtype=torch.int64, device=dev)
    table = torch.arange((bs + 1) * 16, dtype=torch.int32, device=dev).reshape(bs + 1, 16)
    loc = table[1:, 8].to(torch.int64)
    ids = torch.zeros(bs, dtype=torch.int64, device=dev)

    def step() -> None:
        launch_plan(plan, req_pool_indices=rows, prefix_lens=prefix, extend_seq_lens=ones,
                    req_to_token=table)  # fmt: skip
        launch_verify(store, plan, real_kv=real_kv)
        launch_write(store, plan, input_ids=ids, positions=prefix, out_cache_loc=loc,
                     real_kv=real_kv)  # fmt: skip

    compiled = torch.compile(step, fullgraph=True)
    variants = {"eager": step, "compiled": compiled}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    for _ in range(args.rounds):  # interleaved, so drift hits both alike
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
            if dev.type == "cuda":
                torch.cuda.synchronize()
    eager, comp = (statistics.median(times[k]) for k in ("eager", "compiled"))
    print(f"device={dev} torch={torch.__version__} rows={bs}")
    print(f"plan + verify + write: eager {eager:.1f} us, compiled {comp:.1f} us per step")
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
