"""A few launch_plan calls for Nsight Compute, to see each kernel's own duration:

    ncu --clock-control none --metrics gpu__time_duration.sum python benchmarks/ncu_cases.py
    python benchmarks/ncu_cases.py 4096 0     # one case: bs, window
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_plan import WINDOW, make_batch, verify_entries  # noqa: E402
from kv_canary_buffers import PlanBuffers  # noqa: E402
from kv_canary_kernels import launch_plan  # noqa: E402

CASES = [(bs, w) for bs in (1, 256, 4096, 65536) for w in (0, WINDOW)]
if len(sys.argv) == 3:
    CASES = [(int(sys.argv[1]), int(sys.argv[2]))]
for bs, window in CASES:
    if True:
        kwargs = make_batch(bs, window=window, pool=True, device="cuda", seed=bs)
        buffers = PlanBuffers.allocate(
            write_req_capacity=bs, verify_capacity=verify_entries(kwargs), device="cuda"
        )
        print(f"case bs={bs} swa={window}", flush=True)
        for _ in range(2):
            launch_plan(buffers, **kwargs)
        torch.cuda.synchronize()
