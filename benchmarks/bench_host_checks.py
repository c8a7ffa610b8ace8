"""Host time of the plan's per-launch checks: ``PlanBuffers.check()`` and
``validate_plan_args`` (everything ``launch_plan`` does on the host besides the bare
dispatch), median over rounds of many calls (``timeit``).

    python benchmarks/bench_host_checks.py [--device cpu|cuda] [--rounds 15] [--calls 20000]

On the CPU the figures compare implementations of the checks (no kernel is launched);
the absolute launch overhead on a GPU host is measured by ``bench_plan.py``.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch

from kv_canary_buffers import PlanBuffers
from kv_canary_buffers.validation import validate_plan_args


def median_us(fn, rounds: int, calls: int) -> float:
    fn()
    times = timeit.repeat(fn, number=calls, repeat=rounds)
    return statistics.median(times) / calls * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--bs", type=int, default=256)
    args = parser.parse_args(argv)
    dev = torch.device(args.device)
    buffers = PlanBuffers.allocate(
        write_req_capacity=args.bs, verify_capacity=1 << 16, device=dev
    )
    bs = args.bs
    i64 = dict(dtype=torch.int64, device=dev)
    kwargs = dict(
        req_pool_indices=torch.ones(bs, **i64),
        prefix_lens=torch.ones(bs, **i64),
        extend_seq_lens=torch.ones(bs, **i64),
        req_to_token=torch.zeros(bs + 1, 64, dtype=torch.int32, device=dev),
        swa_window_size=16,
        full_to_swa_index_mapping=torch.zeros(1024, **i64),
        req_to_verify_expected_tokens=torch.zeros(bs + 1, 64, dtype=torch.int32, device=dev),
        req_to_verify_expected_tokens_valid_lens=torch.ones(bs, **i64),
    )
    check = median_us(buffers.check, args.rounds, args.calls)
    validate = median_us(lambda: validate_plan_args(buffers, **kwargs), args.rounds, args.calls)
    print(f"device={dev} bs={bs} rounds={args.rounds} calls={args.calls} torch={torch.__version__}")
    print(f"PlanBuffers.check()        {check:8.2f} us")
    print(f"validate_plan_args (all)   {validate:8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
