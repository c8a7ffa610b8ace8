"""Did a change make the launchers' host time shorter?

    python -m benchmarks.probes.launchers_vs_revisions REV [REV ...] [--rounds 9]

Host time per eager call of the launchers of several git revisions, side by side in one
run. Each revision's ``kv_canary_kernels`` is exported into a package of its own (either
layout, as in ``kernels_vs_revisions``; ``benchmarks/revisions.py``); the working tree's
kernels run as ``HEAD``. Per case, every revision's ``launch_plan``, ``launch_verify``
(real-KV NONE and PARTIAL), ``launch_write`` and a whole eager step (plan, verify, write)
run on the same buffers and inputs, validated launchers as an engine calls them (an
exported revision's launchers run this tree's validation). Host time per eager call:
batches of calls without a sync, every variant of a case interleaved batch by batch so
that the host's drift hits all alike, a sync after each batch (outside the timing); the
median over batches (``harness.host_time_stats_us``). ``HEAD bare`` is the working tree's
dispatch on pre-validated arguments (no check), the floor of what validation costs. After
the timing, the stores must hold no violation and no status bit, and ``launch_plan`` must
still equal ``plan_reference``.

Cases: decode plans of 64, 256 and 4096 rows (prefix uniform in [1, 1023], SWA off; 4096
rows takes the eager one-launch plan), their verify and one new token a row; PARTIAL
real-KV as in the benchmark (K and V of one layer, 256 bytes a token). Needs CUDA and git.

Last answer (H200, 2026-11-30 20:26 UTC, ``--rows 64 4096 --calls 10 --rounds 15``:
29143c9 against that evening's code, us): ``launch_plan`` 47.6 -> 45.5 at 64 rows and
31.8 -> 29.6 at 4096 (bare dispatch 15.5 and 13.5), a whole step 106.8 -> 106.3 and 79.1
-> 74.3; verify and write within 1 us.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-compare-host-versions-20261130T2026.txt``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from types import ModuleType

import torch

import kv_canary_kernels
from benchmarks.canary_cases import GPU_SIZES, World, expect_clean
from benchmarks.harness import configure, host_time_stats_us, logged
from benchmarks.revisions import export_kernels
from kv_canary_buffers import PlanBuffers, plan_reference, plans_equal
from kv_canary_buffers.plan import validate_plan_args
from kv_canary_buffers.verify import validate_verify_args
from kv_canary_buffers.write import validate_write_args
from kv_canary_kernels.plan import dispatch_plan
from kv_canary_kernels.verify import dispatch_verify
from kv_canary_kernels.write import dispatch_write


def variants(pkg: ModuleType, w: World, bufs, store, store_kv, kv) -> dict:
    plan = lambda: pkg.launch_plan(bufs, **w.plan_kwargs)  # noqa: E731
    verify = lambda: pkg.launch_verify(store, bufs)  # noqa: E731
    verify_kv = lambda: pkg.launch_verify(store_kv, bufs, real_kv=kv)  # noqa: E731
    write = lambda: pkg.launch_write(store, bufs, **w.step_inputs)  # noqa: E731

    def step() -> None:
        plan()
        verify()
        write()

    return {
        "launch_plan": plan,
        "launch_verify NONE": verify,
        "launch_verify PARTIAL": verify_kv,
        "launch_write": write,
        "step (plan + verify + write)": step,
    }


def bare(w: World, bufs, store, store_kv, kv) -> dict:
    p = validate_plan_args(bufs, **w.plan_kwargs)
    v = validate_verify_args(store, bufs)
    vk = validate_verify_args(store_kv, bufs, real_kv=kv)
    wr = validate_write_args(store, bufs, **w.step_inputs)

    def step() -> None:
        dispatch_plan(bufs, p)
        dispatch_verify(store, bufs, v)
        dispatch_write(store, bufs, wr)

    return {
        "launch_plan": lambda: dispatch_plan(bufs, p),
        "launch_verify NONE": lambda: dispatch_verify(store, bufs, v),
        "launch_verify PARTIAL": lambda: dispatch_verify(store_kv, bufs, vk),
        "launch_write": lambda: dispatch_write(store, bufs, wr),
        "step (plan + verify + write)": step,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("revs", nargs="*", help="git revisions (or kv_canary_kernels copies)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256, 4096])
    args = parser.parse_args(argv)
    configure("cuda", smoke=False)
    with tempfile.TemporaryDirectory() as tmp:
        packages = {rev: export_kernels(rev, Path(tmp)) for rev in args.revs}
        packages["HEAD"] = kv_canary_kernels
        names = [*packages, "HEAD bare"]
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
        print("host us per eager call, median over batches (fastest batch in brackets)")
        print("| rows | launcher | " + " | ".join(names) + " |")
        print("|---" * (len(names) + 2) + "|")
        for rows in args.rows:
            w = World(rows, GPU_SIZES.prefix, 1, 0, "cuda", seed=rows)
            bufs = w.plan()
            kv = w.sources("PARTIAL", GPU_SIZES, seed=1)
            store, store_kv = w.new_store(None), w.new_store(kv)
            table = {
                name: variants(pkg, w, bufs, store, store_kv, kv) for name, pkg in packages.items()
            }
            table["HEAD bare"] = bare(w, bufs, store, store_kv, kv)
            for launcher in table["HEAD"]:
                timed = host_time_stats_us(
                    {name: table[name][launcher] for name in names}, args.calls, args.rounds
                )
                cells = " | ".join(f"{t.median:.1f} [{t.min:.1f}]" for t in timed.values())
                print(f"| {rows} | {launcher} | {cells} |", flush=True)
            torch.cuda.synchronize()
            expect_clean(store, f"the timing at {rows} rows")
            expect_clean(store_kv, f"the timing at {rows} rows (PARTIAL)")
            kv_canary_kernels.launch_plan(bufs, **w.plan_kwargs)
            ref = PlanBuffers.allocate(
                write_req_capacity=bufs.write_req_capacity,
                verify_capacity=bufs.verify_capacity,
                device="cuda",
            )
            plan_reference(ref, **w.plan_kwargs)
            assert plans_equal(bufs, ref, rows), f"launch_plan differs at {rows} rows"
            del w, bufs, store, store_kv, kv, table
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
