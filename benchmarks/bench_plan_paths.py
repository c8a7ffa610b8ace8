"""The large-batch plan's two paths side by side on the GPU: one launch (eager, below
``LaunchConfig.one_launch_max_rows``) against three (captured graphs and larger batches).

Per batch (1024 to 8191 rows, SWA off and on, mean prefix 512): the one-launch path's GPU
time for several worker counts (eager calls queued behind a sleeping kernel: its launches
are numbered and must not be replayed from a graph), the three-launch path's both in a
CUDA graph of 10 calls and queued the same way, and both paths' host time per eager call.
Every plan is checked equal to ``plan_reference`` first.

    PYTHONPATH=. python benchmarks/bench_plan_paths.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import configure, gpu_time, host_time_stats_us, queued_gpu_time
from kv_canary_buffers import PlanBuffers, plan_reference, plans_equal
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import launch_config
from plan_cases import WINDOW, make_batch, verify_entries

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
    raise SystemExit(main())
