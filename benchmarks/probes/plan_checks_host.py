"""What do the plan's per-launch host checks cost?

    python -m benchmarks.probes.plan_checks_host [--device cpu|cuda] [--rounds 15]

Host time of ``PlanBuffers.check()`` and ``validate_plan_args`` (everything ``launch_plan``
does on the host besides the bare dispatch), median over rounds of many calls
(``timeit``); on CUDA also the eager host time of ``launch_plan`` against the bare
``dispatch_plan`` of the same kernels. On the CPU no kernel is launched. It names only
what both layouts of the library export, so it times whichever packages come first on
``sys.path``; for another revision:

    git archive REV kv_canary_buffers kv_canary_kernels | tar -x -C DIR
    cd DIR && PYTHONPATH=ROOT python -m benchmarks.probes.plan_checks_host

(``ROOT``: this checkout; ``python -m`` puts ``DIR`` first.)

Last answer (this project's 2-core CPU machine, 2026-12-01, d175989's library, the machine
loaded by other jobs: load average 5): ``check()`` 0.42 to 0.65 us, ``validate_plan_args``
5.1 to 9.5 us at 1, 256 and 4096 rows, in two runs. The last quiet runs (2026-11-30,
d75635c, before the fields became aliases): ``check()`` 5.0 to 5.2 us, the validation 9.3
to 9.8; on the H200 host ``launch_plan`` 1.46 to 1.65 times its bare dispatch up to 256
rows, 1.26 to 1.30 at 4096. Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/host-checks-cpu-20261130T131645Z-final.log``,
``benchmarks/results/host-checks-cuda-20261130-merged.log``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from pathlib import Path

import torch

from benchmarks.harness import logged
from kv_canary_buffers import PlanBuffers, validate_plan_args


def median_us(fn, rounds: int, calls: int) -> float:
    fn()
    times = timeit.repeat(fn, number=calls, repeat=rounds)
    return statistics.median(times) / calls * 1e6


def make_batch(bs: int, device: torch.device) -> dict:
    """All rows active, prefixes in [1, 1023], window 128 with its LUT, token pool on (the
    host-overhead case of the benchmark's plan stage)."""
    g = torch.Generator().manual_seed(bs)
    cols = 1032
    rows = bs + 1
    prefix = torch.randint(1, 1024, (bs,), generator=g)
    kwargs = dict(
        req_pool_indices=torch.randperm(bs, generator=g) + 1,
        prefix_lens=prefix,
        extend_seq_lens=torch.ones(bs, dtype=torch.int64),
        req_to_token=torch.randperm(rows * cols, generator=g).reshape(rows, cols).to(torch.int32),
        swa_window_size=128,
        full_to_swa_index_mapping=torch.randperm(rows * cols, generator=g),
        req_to_verify_expected_tokens=torch.randint(
            0, 150_000, (rows, cols), generator=g, dtype=torch.int32
        ),
        req_to_verify_expected_tokens_valid_lens=prefix + 1,
    )
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--launch-calls", type=int, default=1000)
    args = parser.parse_args(argv)
    dev = torch.device(args.device)
    print(f"device={dev} rounds={args.rounds} torch={torch.__version__}")
    for bs in (1, 256, 4096):
        kwargs = make_batch(bs, dev)
        entries = int(kwargs["prefix_lens"].clamp(max=128).sum())
        buffers = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=entries, device=dev)
        check = median_us(buffers.check, args.rounds, args.calls)
        validate = median_us(
            lambda: validate_plan_args(buffers, **kwargs), args.rounds, args.calls // 2
        )
        line = f"bs={bs:5d}  check() {check:7.2f} us  validate_plan_args {validate:7.2f} us"
        if dev.type == "cuda":
            from kv_canary_kernels import launch_plan
            from kv_canary_kernels.plan import dispatch_plan

            plan_args = validate_plan_args(buffers, **kwargs)
            variants = {
                "launch_plan": lambda: launch_plan(buffers, **kwargs),
                "bare_dispatch": lambda: dispatch_plan(buffers, plan_args),
            }
            times: dict[str, list] = {k: [] for k in variants}
            for fn in variants.values():
                fn()
            torch.cuda.synchronize()
            for _ in range(args.rounds):  # interleaved, so drift hits both alike
                for name, fn in variants.items():
                    t0 = time.perf_counter()
                    for _ in range(args.launch_calls):
                        fn()
                    times[name].append((time.perf_counter() - t0) / args.launch_calls * 1e6)
                    torch.cuda.synchronize()
            launch = statistics.median(times["launch_plan"])
            bare = statistics.median(times["bare_dispatch"])
            line += (
                f"  launch_plan {launch:7.2f} us  bare {bare:7.2f} us  ratio {launch / bare:.2f}"
            )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
