"""What does a second GPU cost the launchers (buffers on a device that is not current), and
what does the violation gather over NCCL cost?

1. Host time per eager call of ``launch_plan``, ``launch_verify`` and ``launch_write`` (a
   small decode batch, 8 rows) in three set-ups, interleaved in one run (median over rounds
   of ``--calls`` calls without a sync, a sync between rounds):

   - ``cuda:0 / current 0``: buffers on the current device (the one-GPU case);
   - ``cuda:1 / current 1``: buffers on the second GPU, which is current (what each rank of a
     one-process-per-GPU engine does);
   - ``cuda:1 / current 0``: buffers on a device that is not current, so the launcher
     switches devices for the launch and back.

   Beside them, the device check alone (the query the launchers make per call).
2. ``gather_violation_reports`` over NCCL with 2 processes (one per GPU): the median time of
   one call when no rank has violations (one small all-gather) and when rank 1 has 100 rows.

    python -m benchmarks.probes.two_gpu_costs [--calls 2000] [--rounds 9]

Needs two CUDA devices. Prints two markdown tables (docs/performance.md, "Many GPUs").

Last answer (two H200s, 2026-11-30 15:46 UTC, the session's final code): host us per eager
call, cuda:0 current 0 / cuda:1 current 1 / cuda:1 current 0: ``launch_plan`` 30.0 / 29.2
/ 31.3, ``launch_verify`` 22.6 / 21.9 / 23.7, ``launch_write`` 24.3 / 32.1 / 28.0; the
device check 189 ns a call; ``gather_violation_reports`` 156 us (rank 0) / 144 us (rank 1)
with no violations, 682 / 397 us when rank 1 has 100 rows.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200x2-final-20261130T1546.log``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import torch

from benchmarks.harness import logged, markdown_table
from kv_canary_buffers import CanaryStore, PlanBuffers
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from kv_canary_kernels.fast_launch import current_device

BS = 8
COLS = 64


def make_step(device: torch.device):
    """A decode batch of ``BS`` rows: the plan's buffers and inputs, a store and the write's
    inputs, all on ``device``."""
    g = torch.Generator().manual_seed(device.index or 0)
    rows = BS + 1
    table = (torch.randperm(rows * COLS, generator=g) + 1).reshape(rows, COLS).to(torch.int32)
    kw = dict(
        req_pool_indices=torch.arange(1, BS + 1),
        prefix_lens=torch.randint(1, COLS - 4, (BS,), generator=g),
        extend_seq_lens=torch.ones(BS, dtype=torch.int64),
        req_to_token=table,
    )
    kw = {k: v.to(device) for k, v in kw.items()}
    plan = PlanBuffers.allocate(write_req_capacity=BS, verify_capacity=BS * COLS, device=device)
    store = CanaryStore.allocate(
        num_slots=2 * rows * COLS + 1, violation_capacity=1024, device=device
    )
    write = dict(
        input_ids=torch.randint(0, 1000, (BS,), generator=g).to(device),
        positions=torch.arange(BS).to(device),
        out_cache_loc=(rows * COLS + 1 + torch.arange(BS)).to(device),
    )
    launch_plan(plan, **kw)
    return dict(
        plan=lambda: launch_plan(plan, **kw),
        verify=lambda: launch_verify(store, plan),
        write=lambda: launch_write(store, plan, **write),
    )


def host_us(fn, current: int, calls: int) -> float:
    torch.cuda.set_device(current)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    return dt / calls * 1e6


def launch_table(calls: int, rounds: int) -> str:
    on0, on1 = make_step(torch.device("cuda", 0)), make_step(torch.device("cuda", 1))
    setups = {
        "cuda:0 / current 0": (on0, 0),
        "cuda:1 / current 1": (on1, 1),
        "cuda:1 / current 0": (on1, 0),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds + 1):  # the first round warms up and is dropped
        for stage in ("plan", "verify", "write"):
            for name, (fns, current) in setups.items():
                times.setdefault((stage, name), []).append(host_us(fns[stage], current, calls))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    rows = [
        [stage] + [f"{med[(stage, name)]:.1f}" for name in setups]
        for stage in ("plan", "verify", "write")
    ]
    torch.cuda.set_device(0)
    check = statistics.median(timeit.repeat(current_device, number=100_000, repeat=rounds)) * 10
    table = markdown_table(["launcher (host us per eager call)", *setups], rows)
    return f"{table}\n\nThe device check alone (`_cuda_getDevice`): {check * 1000:.0f} ns per call."


def _gather_worker(rank: int, init_file: str, results, calls: int) -> None:
    import torch.distributed as dist

    from kv_canary_buffers.distributed import gather_violation_reports

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        dev = torch.device("cuda", rank)
        step = make_step(dev)
        store = CanaryStore.allocate(num_slots=4096, violation_capacity=128, device=dev)
        out = {}
        for case in ("no violations", "rank 1 has 100 rows"):
            times = []
            for _ in range(calls):
                if case != "no violations" and rank == 1:
                    store.violation_count.fill_(100)  # 100 rows of the zeroed ring
                report = store.take_violations()
                dist.barrier()
                t0 = time.perf_counter()
                gather_violation_reports(report, dst=0)
                times.append((time.perf_counter() - t0) * 1e6)
            out[case] = statistics.median(times[1:])
        del step
        results[rank] = out
    finally:
        dist.destroy_process_group()


def gather_table(calls: int) -> str:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(
            _gather_worker, args=(os.path.join(tmp, "init"), results, calls), nprocs=2, join=True
        )
        rows = [[case, f"{results[0][case]:.0f}", f"{results[1][case]:.0f}"] for case in results[0]]
    return markdown_table(["gather_violation_reports over NCCL", "rank 0 us", "rank 1 us"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--gather-calls", type=int, default=50)
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print("kv-canary: two_gpu_costs needs two CUDA devices", file=sys.stderr)
        return 2
    print(
        f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}"
    )
    print(launch_table(args.calls, args.rounds))
    print()
    print(gather_table(args.gather_calls))
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
