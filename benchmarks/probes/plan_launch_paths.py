"""Which path should an eager large-batch plan take: one launch or three?

    python -m benchmarks.probes.plan_launch_paths [--out DIR]

The large-batch plan's two paths side by side on the GPU: one launch (eager, below
``LaunchConfig.one_launch_max_rows``) against three (captured graphs and larger batches).
Per batch (1024 to 8191 rows, SWA off and on, mean prefix 512): the one-launch path's GPU
time for several worker counts (eager calls queued behind a sleeping kernel: its launches
are numbered and must not be replayed from a graph), the three-launch path's both in a
CUDA graph of 10 calls and queued the same way, and both paths' host time per eager call.
Every plan is checked equal to ``plan_reference`` first. ``--out DIR``: the rows as JSON
too. Needs CUDA.

Last answer (H200, 2026-11-30 17:19 UTC, after the one-launch path's review fixes): at 4096
rows the one launch takes 39.3 us of GPU time without SWA and 25.0 with it (4 workers an
SM), the three launches 29.7 / 19.5 in a graph, but an eager call costs the larger of its
host and GPU times and the host takes 34.8 us for one launch against 55.2 for three: one
launch wins below 6144 rows (8191 rows: 75.7 us GPU against 54.4 host for three, without
SWA), hence ``one_launch_max_rows = 6144``.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-plan-paths-20261130T1719-after-review.log``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.harness import configure, gpu_time, host_time_stats_us, logged, queued_gpu_time
from benchmarks.plan_cases import WINDOW, make_batch, verify_entries
from kv_canary_buffers import PlanBuffers, plan_reference, plans_equal
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import launch_config

BATCHES = (1024, 2048, 4096, 8191)
WORKERS_PER_SM = (2, 4, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    configure("cuda", False)
    rows = []
    for bs in BATCHES:
        for window in (0, WINDOW):
            kwargs = make_batch(bs, window=window, pool=True, device="cuda", seed=bs)
            entries = verify_entries(kwargs)
            ref = PlanBuffers.allocate(
                write_req_capacity=bs, verify_capacity=entries, device="cuda"
            )
            plan_reference(ref, **kwargs)
            buffers: list[PlanBuffers] = []

            def fresh() -> PlanBuffers:
                # New (zeroed) buffers per configuration: the check after its first plan
                # must see that configuration's output, not the previous one's.
                buffers.append(
                    PlanBuffers.allocate(
                        write_req_capacity=bs, verify_capacity=entries, device="cuda"
                    )
                )
                return buffers[-1]

            def plan() -> None:
                launch_plan(buffers[-1], **kwargs)

            row: dict[str, object] = {"bs": bs, "swa": window}
            for per_sm in WORKERS_PER_SM:
                with launch_config(one_launch_programs_per_sm=per_sm, one_launch_max_rows=1 << 30):
                    buf = fresh()
                    plan()
                    torch.cuda.synchronize()
                    assert plans_equal(buf, ref, bs) and int(buf.take_status()) == 0
                    row[f"one_launch_p{per_sm}_gpu_us"] = round(queued_gpu_time(plan).us, 2)
                    if per_sm == 4:
                        host = host_time_stats_us({"one": plan}, 300)["one"]
                        row["one_launch_host_us"] = round(host.median, 1)
            with launch_config(one_launch_max_rows=0):
                buf = fresh()
                plan()
                torch.cuda.synchronize()
                assert plans_equal(buf, ref, bs)
                row["three_launches_graph_gpu_us"] = round(gpu_time(plan, 50).us, 2)
                row["three_launches_gpu_us"] = round(queued_gpu_time(plan).us, 2)
                host = host_time_stats_us({"three": plan}, 300)["three"]
                row["three_launches_host_us"] = round(host.median, 1)
            print(row, flush=True)
            rows.append(row)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan-paths.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
