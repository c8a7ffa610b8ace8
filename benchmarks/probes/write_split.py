"""What does the split write's post-forward stamp cost against today's one-launch write,
and does its chain, on a side stream, slow a concurrent bf16 GEMM of realistic size?

    python -m benchmarks.probes.write_split            # needs CUDA (the H200)
    python -m benchmarks.probes.write_split --quick    # fewer replays
    python -m benchmarks.probes.write_split --smoke    # the code path on the CPU (interpreter)

Part 1, the stamp (issue 28 targets: at most 30 us for 1 x 8192 and 16 x 2048 in real-KV
NONE and PARTIAL, at most the write's time for decode 4096 x 1). The cases are the
benchmark's write cases (``benchmarks.canary_cases``: a store holding every prefix, a plan
by ``launch_plan``, one layer's K and V as the PARTIAL sources, 256 bytes a token). Per
case: ``launch_write`` (a CUDA graph of 10 calls, median of replays, as the benchmark
times it), the chain alone (a graph of 10 chains, each on its own workspace) and the
stamp alone (a graph of 10 stamps, one per workspace, each replay after a replay of the
chains' graph, which makes every stamp fresh: only the stamps' graph is timed). Before
timing, one chain + stamp is checked equal to one ``launch_write`` (records, owners,
counters, status, rows) on copies of the store.

Part 2, the chain beside a GEMM: ``torch.matmul`` of two bf16 8192 x 8192 matrices into a
preallocated output, with and without a chain (each case's) launched on a side stream
just before it (the split write's pattern: the side stream waits for an event the main
stream recorded, and the main stream joins it after the GEMM). The two variants
alternate, round after round; each GEMM is timed with CUDA events on the main stream
(its own duration, whatever the side stream does), the median over rounds; and the same
as CUDA graphs (a graph of the GEMM alone; a graph of the fork, the chain, the GEMM and
the join), the GEMM timed inside each replay by event nodes around it (``external``
events), median of replays. Target: the GEMM at most 1% slower. ``--chain-sleep-ns`` and
``--chain-maxnreg`` (comma-separated, each sleep with each cap) repeat it for chains
launched under ``LaunchConfig.write_chain_sleep_ns`` / ``write_chain_maxnreg`` (each
first checked equal to ``launch_write``). ``--stamp-shapes 32x1,64x2`` times the stamp
of part 1 again with other programs (``LaunchConfig.write_stamp_block`` tokens and
``write_stamp_warps`` warps a program), each checked equal first.

Part 3, host time per eager call (``benchmarks.harness.host_time_stats_us``: batches of
eager calls without a sync, medians): ``launch_write``, ``launch_write_chain`` and a chain
followed by its stamp (a stamp needs a chain before it; the stamp's own host time is the
difference). Both take the write's host fast path (cached addresses) after their first
call: the figures to hold against the 30 us host budget. The same on the CPU, the launch
stubbed: ``python -m benchmarks.probes.write_split_host``.

Last answer (H200, 2026-12-02, fe30b68's kernels): ``--quick --stamp-shapes
32x1,64x1,64x2,128x1,256x4``: the stamp at 32 x 1 (the default since) 2.48 us for decode
4096 x 1 against 2.80 at 128 x 4 (the default then) and ``launch_write``'s 2.55; on
16 x 2048 and 1 x 8192 2.8 to 5.8 us (128 x 4: 2.8 to 5.3; ``launch_write`` 238 to 6,140
us); the chain 1.37x ``launch_write`` on prefill (326 and 1,296 us); host per eager call:
the chain 15.9 to 30.6 us, chain + stamp 26.9 to 55.7, ``launch_write`` 13.0 to 29.2.
``--quick --chain-maxnreg 0,32,40``: the GEMM beside the chains of 16 x 2048 / 1 x 8192
+7.6 / +6.5% eager and +7.0 / +7.1% in a graph, +0.1% beside a decode chain; a register
cap of 32 or 40 did not lower it (+5.3 to +14.8%, the chain spilling and 1.5x to 2x
longer), nor did sleeping after each token (b6d3d6e: 1 x 8192 at +6.8 to +6.9% in a graph
up to 2,048 ns a token). ``benchmarks.probes.gemm_neighbours``
finds the same slowdown beside a kernel that only spins. The tables are in
docs/performance.md ("Write").
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from benchmarks.canary_cases import GPU_SIZES, SMOKE_SIZES, Sizes, World
from benchmarks.harness import (
    configure,
    gpu_time,
    host_time_stats_us,
    logged,
    markdown_table,
    on_gpu,
)
from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV, WriteWorkspace
from kv_canary_kernels import launch_write, launch_write_chain, launch_write_stamp
from kv_canary_kernels.config import launch_config

CALLS = 10
"""Launches a timed replay holds (stamps, chains or writes)."""
GEMM = 8192


def cases(sizes: Sizes) -> list[tuple[str, int, int, tuple[int, int]]]:
    """(name, rows, tokens a row, prefix range) of the write cases the issue names."""
    by_kind = {(c.rows, c.tokens): c for c in sizes.write}
    wanted = [(4096, 1), (16, 2048), (1, 8192)] if sizes is GPU_SIZES else list(by_kind)
    out = []
    for rows, tokens in wanted:
        case = by_kind[rows, tokens]
        out.append((f"{case.kind} {rows} x {tokens}", rows, tokens, case.prefix))
    return out


class Split:
    """One case's world, store, plan and ``CALLS`` workspaces, for one real-KV mode."""

    def __init__(self, sizes: Sizes, rows: int, tokens: int, prefix, mode: str, device: str):
        self.world = World(rows, prefix, tokens, 0, device, seed=rows * 131 + tokens)
        self.real_kv: RealKV | None = self.world.sources(mode, sizes, seed=7)
        self.store: CanaryStore = self.world.new_store(self.real_kv)
        self.plan: PlanBuffers = self.world.plan()
        self.inputs = self.world.step_inputs
        self.workspaces = [
            WriteWorkspace.for_store(self.store, token_capacity=max(self.world.n, 1))
            for _ in range(CALLS)
        ]

    def chain(self, k: int = 0) -> None:
        launch_write_chain(self.store, self.plan, self.workspaces[k], **self.inputs)

    def stamp(self, k: int = 0) -> None:
        launch_write_stamp(self.store, self.plan, self.workspaces[k], real_kv=self.real_kv)

    def write(self) -> None:
        launch_write(self.store, self.plan, real_kv=self.real_kv, **self.inputs)

    def check_equal(self) -> None:
        """One chain + stamp against one launch_write, on copies of the store."""
        split, whole = copy.deepcopy(self.store), copy.deepcopy(self.store)
        ws = WriteWorkspace.for_store(split, token_capacity=max(self.world.n, 1))
        launch_write_chain(split, self.plan, ws, **self.inputs)
        launch_write_stamp(split, self.plan, ws, real_kv=self.real_kv)
        launch_write(whole, self.plan, real_kv=self.real_kv, **self.inputs)
        for name in ("records", "owners", "kernel_runs", "slots_processed", "status"):
            if not torch.equal(getattr(split, name), getattr(whole, name)):
                raise AssertionError(f"the split write's {name} differ from launch_write's")
        count = int(whole.violation_count)
        if int(split.violation_count) != count or sorted(
            split.violations[:count].tolist()
        ) != sorted(whole.violations[:count].tolist()):
            raise AssertionError("the split write's violation rows differ from launch_write's")


def time_stamps(split: Split, replays: int) -> float:
    """GPU time of one stamp: a graph of ``CALLS`` stamps (one per workspace), each replay
    after an untimed replay of the ``CALLS`` chains' graph (so each stamp is fresh)."""
    if not on_gpu():
        times = []
        for _ in range(replays):
            for k in range(CALLS):
                split.chain(k)
            t0 = _now()
            for k in range(CALLS):
                split.stamp(k)
            times.append((_now() - t0) / CALLS)
        return statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for k in range(CALLS):  # compiles and warms up outside the capture
            split.chain(k)
            split.stamp(k)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    chains, stamps = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(chains):
        for k in range(CALLS):
            split.chain(k)
    with torch.cuda.graph(stamps):
        for k in range(CALLS):
            split.stamp(k)
    before = int(split.store.kernel_runs)
    times = []
    for _ in range(replays):
        chains.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        stamps.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    torch.cuda.synchronize()
    # every replayed stamp was fresh: each counted its run, none raised the stale bit
    if int(split.store.kernel_runs) - before != replays * CALLS or int(split.store.status):
        raise AssertionError("a replayed stamp was not fresh (or raised a status bit)")
    return statistics.median(times)


def time_chains(split: Split, replays: int) -> float:
    """GPU time of one chain: a graph of ``CALLS`` chains (one per workspace)."""

    def chains() -> None:
        for k in range(CALLS):
            split.chain(k)

    return gpu_time(chains, replays, 1).us / CALLS


def _now() -> float:
    import time

    return time.perf_counter() * 1e6


def on_side(
    side: torch.cuda.Stream,
    forked: torch.cuda.Event,
    neighbour: Callable[[], None],
    work: Callable[[], None],
) -> None:
    """The split write's pattern: ``neighbour`` on ``side`` after an event recorded on the
    current stream (the capture's stream inside ``torch.cuda.graph``), ``work`` on the
    current stream beside it, then the current stream joins ``side``."""
    here = torch.cuda.current_stream()
    forked.record(here)
    side.wait_event(forked)
    with torch.cuda.stream(side):
        neighbour()
    work()
    here.wait_stream(side)


def gemm_beside(split: Split, rounds: int) -> tuple[float, float, float, float]:
    """The GEMM's time alone and beside the case's chain on a side stream: (eager alone,
    eager beside, graph alone, graph beside), medians in us."""
    device = split.store.device
    n = GEMM if on_gpu() else 64
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)

    def gemm() -> None:
        torch.matmul(a, b, out=c)

    if not on_gpu():
        gemm()
        split.chain()
        return (0.0, 0.0, 0.0, 0.0)
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    forked = torch.cuda.Event()
    for _ in range(3):  # warm-up (cuBLAS's heuristics, the chain's compile)
        gemm()
        on_side(side, forked, split.chain, gemm)
    torch.cuda.synchronize()
    alone_t, beside_t = [], []
    for _ in range(rounds):
        for chained, out in ((False, alone_t), (True, beside_t)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

            def timed() -> None:
                start.record(main)
                gemm()
                end.record(main)

            if chained:
                on_side(side, forked, split.chain, timed)
            else:
                timed()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
    # In the graphs the GEMM is timed by event nodes around it (``external`` events are
    # captured as record nodes): the replay's own span would also hold the chain, whose
    # join ends it.
    marks = {
        name: tuple(torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        for name in ("alone", "beside")
    }

    def marked(name: str) -> None:
        here = torch.cuda.current_stream()
        marks[name][0].record(here)
        gemm()
        marks[name][1].record(here)

    def beside_marked() -> None:
        on_side(side, forked, split.chain, lambda: marked("beside"))

    graphs = {}
    for name, fn in (("alone", lambda: marked("alone")), ("beside", beside_marked)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graphs[name] = graph
    replay_t: dict[str, list[float]] = {"alone": [], "beside": []}
    for _ in range(rounds):
        for name, graph in graphs.items():
            graph.replay()
            torch.cuda.synchronize()
            replay_t[name].append(marks[name][0].elapsed_time(marks[name][1]) * 1e3)
    return (
        statistics.median(alone_t),
        statistics.median(beside_t),
        statistics.median(replay_t["alone"]),
        statistics.median(replay_t["beside"]),
    )


def host_times(split: Split, calls: int) -> tuple[float, float, float]:
    """Host us per eager call: launch_write, the chain, a chain and its stamp."""

    def pair() -> None:
        split.chain()
        split.stamp()

    got = host_time_stats_us(
        {"write": split.write, "chain": split.chain, "pair": pair}, calls=calls
    )
    return got["write"].median, got["chain"].median, got["pair"].median


def run(
    sizes: Sizes,
    device: str,
    replays: int,
    rounds: int,
    variants: tuple[tuple[int, int], ...] = ((0, 0),),
    stamp_shapes: tuple[tuple[int, int], ...] = (),
) -> int:
    stamp_rows, gemm_rows, host_rows = [], [], []
    for name, rows, tokens, prefix in cases(sizes):
        for mode in ("NONE", "PARTIAL"):
            split = Split(sizes, rows, tokens, prefix, mode, device)
            split.check_equal()
            write_us = gpu_time(split.write, replays, CALLS).us
            chain_us = time_chains(split, replays)
            stamp_us = time_stamps(split, replays)
            row = [name, mode, f"{write_us:.2f}", f"{chain_us:.2f}", f"{stamp_us:.2f}"]
            for block, warps in stamp_shapes:
                # LaunchConfig.write_stamp_block / write_stamp_warps: tokens and warps a
                # stamp program (the same records either way)
                with launch_config(write_stamp_block=block, write_stamp_warps=warps):
                    split.check_equal()
                    row.append(f"{time_stamps(split, replays):.2f}")
            stamp_rows.append(tuple(row))
            h_write, h_chain, h_pair = host_times(split, calls=50 if on_gpu() else 1)
            host_rows.append(
                (
                    name,
                    mode,
                    f"{h_write:.1f}",
                    f"{h_chain:.1f}",
                    f"{h_pair:.1f}",
                    f"{h_pair - h_chain:.1f}",
                )
            )
            for sleep, maxnreg in variants if mode == "NONE" else ():
                # LaunchConfig.write_chain_sleep_ns / write_chain_maxnreg: the chain's walk
                # sleeping after each token, or compiled to fewer registers; its own time
                # and the GEMM's beside it
                with launch_config(write_chain_sleep_ns=sleep, write_chain_maxnreg=maxnreg):
                    if sleep or maxnreg:
                        split.check_equal()  # the same records either way
                    slept_us = time_chains(split, replays) if sleep or maxnreg else chain_us
                    alone, beside, g_alone, g_beside = gemm_beside(split, rounds)
                gemm_rows.append(
                    (
                        name,
                        str(sleep),
                        str(maxnreg or "-"),
                        f"{slept_us:.1f}",
                        f"{alone:.1f}",
                        f"{beside:.1f}",
                        f"{100 * (beside / alone - 1):+.2f}%" if alone else "-",
                        f"{g_alone:.1f}",
                        f"{g_beside:.1f}",
                        f"{100 * (g_beside / g_alone - 1):+.2f}%" if g_alone else "-",
                    )
                )
            del split
            if device == "cuda":
                torch.cuda.empty_cache()
    print(
        f"Stamp against launch_write (GPU us per call; a CUDA graph of {CALLS} launches a "
        "replay, median of replays; the stamps' replays each after a replay of the chains'):"
    )
    shapes = tuple(f"stamp {b} x {w}" for b, w in stamp_shapes)
    print(
        markdown_table(
            ("case", "real-KV", "launch_write", "chain alone", "stamp alone", *shapes),
            stamp_rows,
        )
    )
    print(
        f"bf16 GEMM {GEMM} x {GEMM} x {GEMM} beside the case's chain on a side stream (us, "
        "medians; eager: the GEMM timed on the main stream; graph: the GEMM timed inside "
        "one replay of the GEMM alone (1 launch) or of fork + chain + GEMM + join (2 "
        "launches); sleep ns: LaunchConfig.write_chain_sleep_ns, the chain's walk sleeping "
        "after each token; maxnreg: LaunchConfig.write_chain_maxnreg):"
    )
    print(
        markdown_table(
            (
                "chain of",
                "sleep ns",
                "maxnreg",
                "chain us",
                "GEMM alone",
                "GEMM beside",
                "slowdown",
                "graph alone",
                "graph beside",
                "slowdown",
            ),
            gemm_rows,
        )
    )
    print("Host time per eager call (us, medians of batches without a sync):")
    print(
        markdown_table(
            ("case", "real-KV", "launch_write", "chain", "chain + stamp", "stamp (difference)"),
            host_rows,
        )
    )
    return 0


def smoke(stamp_shapes: tuple[tuple[int, int], ...] = ()) -> int:
    """The probe's code path at tiny sizes on the CPU (interpreter), with its checks."""
    global CALLS
    configure("cpu", smoke=True)
    CALLS = 2  # each program costs the interpreter milliseconds
    return run(SMOKE_SIZES, "cpu", replays=1, rounds=1, stamp_shapes=stamp_shapes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--quick", action="store_true", help="fewer replays and rounds")
    parser.add_argument(
        "--chain-sleep-ns",
        default="0",
        help="comma-separated LaunchConfig.write_chain_sleep_ns values for the GEMM part "
        "(CUDA only; default 0, the walk at full speed)",
    )
    parser.add_argument(
        "--chain-maxnreg",
        default="0",
        help="comma-separated LaunchConfig.write_chain_maxnreg values for the GEMM part, each "
        "with each sleep (CUDA only; default 0, the compiler's choice)",
    )
    parser.add_argument(
        "--stamp-shapes",
        default="",
        help="comma-separated TOKENSxWARPS stamp programs (LaunchConfig.write_stamp_block x "
        "write_stamp_warps) timed beside the default's, each checked equal first",
    )
    args = parser.parse_args(argv)
    try:
        shapes = tuple(
            (int(b), int(w)) for b, w in (v.split("x") for v in args.stamp_shapes.split(",") if v)
        )
    except ValueError:
        parser.error(
            f"kv-canary: --stamp-shapes must be TOKENSxWARPS[,...], got {args.stamp_shapes!r}"
        )
    if args.smoke:
        return smoke(shapes)
    if not torch.cuda.is_available():
        print("write_split: needs CUDA (or --smoke under TRITON_INTERPRET=1)")
        return 1
    configure("cuda", smoke=False)
    replays, rounds = (20, 10) if args.quick else (100, 30)
    variants = tuple(
        (int(s), int(r))
        for s in args.chain_sleep_ns.split(",")
        for r in args.chain_maxnreg.split(",")
    )
    return run(GPU_SIZES, "cuda", replays, rounds, variants, shapes)


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
