"""SGLang 0.5.23's CUDA kv-canary kernels beside this project's, on the same inputs.

Question: on the benchmark workloads, do SGLang's CUDA plan, write and verify produce the
same bytes as ``launch_plan``, ``launch_write`` and ``launch_verify``, and what GPU time does
each take (median over CUDA-graph replays of 10 calls each)?

Workloads (``GPU_CASES``): verify after a decode plan of 64, 256 and 4096 rows (prefixes
uniform in [1, 1023], mean 512; the expected-token pool checked), real-KV NONE, PARTIAL
(K and V of one layer, 256 bytes a token, page size 1) and ALL (1 KB a token each, read
whole); write of a decode step (256 x 1, 4096 x 1), a chunked prefill (16 x 2048 after such
prefixes) and a long prefill (1 x 8192, no prefix), real-KV NONE, the chain-position check
on; plan of 64, 256 and 4096 decode rows with the token pool. Each case builds one world
(``World``): a random permutation of the pool as ``req_to_token``, a token pool, records of
every prefix. Compared, before anything is timed:

- plan: every output field (``write_offsets``, seeds, counts, the verify entries);
- the prefill of every prefix, written by each side from its own plan: records byte for
  byte (real-KV hashes included);
- the step's write: records, violation rows (none), both counters;
- verify: nothing reported on the clean records, both counters; then the positions of up
  to 64 verified slots flipped in both stores: the same violation rows (as multisets: the
  row order of one call is unspecified on both sides).

Command (the GPU machine; the wheels from ``scripts/download-sglang-wheels.sh`` travel as
``.whl``, about 42 MB; SGLang JIT-compiles its CUDA with nvcc on the first call of each
kernel, a minute or two)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:. python3 benchmarks/sglang/run_cuda_differential.py --out sglang.csv

It prints a markdown table, writes the CSV to ``--out``, and exits 1 if any case differs.
SGLang's runtime is not imported: ``benchmarks.sglang_cuda.load_installed_sglang`` executes
only ``sglang.kernels.ops.kv_canary`` and its JIT loader, with the parent packages stubbed;
the calling adapters and the comparisons are that module's too, shared with ``python -m
benchmarks`` (whose ``sglang_cuda`` column runs them on the benchmark's own cases).
``tests/sglang/test_cuda_differential_smoke.py`` runs ``run`` on the CPU with SGLang's
torch references standing in for its CUDA kernels (same signatures) and this project's
kernels in Triton's interpreter.

Last answer (H200, 4e5a91e, sglang 0.5.23): every case the same outputs, this project's
GPU time 0.24 to 0.80 of SGLang's (us, ours / SGLang's): verify 4096 rows NONE 62.2 /
108.0, PARTIAL 174.8 / 251.7, ALL 1,307 / 5,216; write 4096 x 1 2.8 / 6.4, 16 x 2048 238 /
597, 1 x 8192 946 / 2,121; plan 64 / 256 / 4096 rows 3.3 / 13.8, 4.6 / 15.3, 31.5 / 96.2.
The whole table is in docs/performance.md.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from benchmarks.sglang_cuda import (
    OurSide,
    SglangOps,
    SglangUnavailable,
    load_installed_sglang,
    sglang_beside,
    verify_and_compare,
    write_and_compare,
)
from kv_canary_buffers import RealKV, RealKVMode

I64 = torch.int64
I32 = torch.int32
TAG = 2  # CanaryLaunchTag.TAIL_K_FULL: any tag, the same on both sides


# --- workloads ----------------------------------------------------------------------------
class Case(NamedTuple):
    stage: str  # "plan", "write" or "verify"
    rows: int
    tokens: int
    """New tokens a row (the step's extend length)."""
    prefix: tuple[int, int]
    """Prefix lengths, uniform in this closed range."""
    mode: str  # real-KV mode: NONE, PARTIAL, ALL

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.tokens}" + (f" P{self.prefix[0]}-{self.prefix[1]}")


class Sizes(NamedTuple):
    partial_bytes_per_token: int
    all_bytes_per_token: int


MEAN_512 = (1, 1023)
GPU_CASES = (
    *(
        Case("verify", bs, 1, MEAN_512, m)
        for bs in (64, 256, 4096)
        for m in ("NONE", "PARTIAL", "ALL")
    ),
    Case("write", 256, 1, MEAN_512, "NONE"),
    Case("write", 4096, 1, MEAN_512, "NONE"),
    Case("write", 16, 2048, MEAN_512, "NONE"),
    Case("write", 1, 8192, (0, 0), "NONE"),
    *(Case("plan", bs, 1, MEAN_512, "NONE") for bs in (64, 256, 4096)),
)
GPU_SIZES = Sizes(partial_bytes_per_token=256, all_bytes_per_token=1024)
SMOKE_CASES = (
    *(Case("verify", 3, 1, (1, 7), m) for m in ("NONE", "PARTIAL", "ALL")),
    Case("write", 3, 1, (1, 7), "NONE"),
    Case("write", 2, 5, (1, 7), "NONE"),
    Case("write", 1, 9, (0, 0), "NONE"),
    Case("plan", 3, 1, (1, 7), "NONE"),
)
"""Tiny cases for the CPU (Triton's interpreter, SGLang's torch references): every code
path of the GPU run."""
SMOKE_SIZES = Sizes(partial_bytes_per_token=32, all_bytes_per_token=64)


class World:
    """One case's tables, batch and token inputs, built the same for both sides."""

    def __init__(self, case: Case, sizes: Sizes, device: str, seed: int):
        g = torch.Generator().manual_seed(seed)
        bs, extend = case.rows, case.tokens
        lo, hi = case.prefix
        P = torch.randint(lo, hi + 1, (bs,), generator=g)
        E = torch.full((bs,), extend, dtype=I64)
        cols = hi + extend + 8
        rows = bs + 1  # row 0: the padding row, never in the batch
        slots = rows * cols
        # Slots 1..N in random order (slot 0 is the pool's padding slot, never used).
        table = (torch.randperm(slots, generator=g) + 1).reshape(rows, cols).to(I32)
        rp = torch.randperm(bs, generator=g) + 1
        pool = torch.randint(0, 150_000, (rows, cols), generator=g, dtype=I32)
        self.case, self.device = case, device
        self.bs = bs
        self.num_slots = slots + 1
        self.entries = int(P.sum())

        def on(d: dict[str, Any]) -> dict[str, Any]:
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in d.items()}

        def tokens(start: torch.Tensor, count: torch.Tensor) -> dict[str, torch.Tensor]:
            row = torch.repeat_interleave(torch.arange(bs), count)
            first = torch.cumsum(count, 0) - count
            pos = start[row] + torch.arange(int(count.sum())) - first[row]
            r = rp[row]
            return on(
                {
                    "input_ids": pool[r, pos].long(),
                    "positions": pos,
                    "out_cache_loc": table[r, pos].long(),
                }
            )

        common = dict(
            req_pool_indices=rp,
            req_to_token=table,
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            kv_token_id_vs_position_offset=0,
        )
        self.plan_kwargs = on(
            dict(
                common,
                prefix_lens=P,
                extend_seq_lens=E,
                req_to_verify_expected_tokens=pool,
                req_to_verify_expected_tokens_valid_lens=P + E,
            )
        )
        # The prefill that wrote every prefix: no prefix, P new tokens a row.
        self.fill_kwargs = on(
            dict(
                common,
                prefix_lens=torch.zeros_like(P),
                extend_seq_lens=P,
                req_to_verify_expected_tokens=None,
                req_to_verify_expected_tokens_valid_lens=None,
            )
        )
        self.fill_inputs = tokens(torch.zeros_like(P), P)
        self.step_inputs = tokens(P, E)
        self.kv: list[torch.Tensor] = []
        self.bytes_per_token = 0
        if case.mode != "NONE":  # K and V of one layer: bf16, page size 1, random bytes
            bpt = (
                sizes.partial_bytes_per_token
                if case.mode == "PARTIAL"
                else sizes.all_bytes_per_token
            )
            self.bytes_per_token = bpt
            # Random bytes made where they live (4 GB a source for ALL at 4096 rows).
            gdev = torch.Generator(device=device).manual_seed(seed)
            self.kv = [
                torch.empty((self.num_slots, bpt // 8), dtype=I64, device=device)
                .random_(generator=gdev)
                .view(torch.bfloat16)
                for _ in range(2)
            ]

    def real_kv(self) -> RealKV | None:
        if not self.kv:
            return None
        return RealKV(
            mode=RealKVMode[self.case.mode],
            sources=tuple(self.kv),
            page_size=1,
            bytes_per_token=self.bytes_per_token,
        )


# --- timing ------------------------------------------------------------------------------------
Timer = Callable[[Callable[[], None]], float]


def gpu_time(fn: Callable[[], None], replays: int = 50, calls: int = 10) -> float:
    """GPU microseconds of one call: a CUDA graph of ``calls`` back-to-back calls, timed
    with CUDA events per replay, divided by ``calls``; the median over ``replays``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # JIT compiles and warms up outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def no_time(fn: Callable[[], None]) -> float:
    """The CPU smoke test's timer: one call, no figure."""
    fn()
    return float("nan")


# --- the run ------------------------------------------------------------------------------------
class Row(NamedTuple):
    stage: str
    case: str
    mode: str
    entries: int
    ours_us: float
    sglang_us: float
    equal: bool
    detail: str


def run_case(sg: SglangOps, case: Case, sizes: Sizes, device: str, timer: Timer, seed: int) -> Row:
    world = World(case, sizes, device, seed)
    cv = max(world.entries, 1)
    real_kv = world.real_kv()
    ours = OurSide.allocate(
        bs=world.bs,
        verify_capacity=cv,
        num_slots=world.num_slots,
        device=device,
        real_kv=real_kv,
        launch_tag=TAG,
    )
    # The prefill of every prefix, each side from its own plan; the step's plan.
    theirs, bad = sglang_beside(sg, ours, world, fill=world.entries > 0)
    if int(ours.plan_buffers.verify_num_valid) != world.entries:
        bad.append("plan: not every entry")

    fns: tuple[Callable[[], None], Callable[[], None]]
    if case.stage == "plan":
        fns = (lambda: ours.plan(world.plan_kwargs), lambda: theirs.plan(world.plan_kwargs))
    elif case.stage == "write":
        bad += write_and_compare(ours, theirs, world.step_inputs)
        fns = (lambda: ours.write(world.step_inputs), lambda: theirs.write(world.step_inputs))
    else:
        bad += verify_and_compare(ours, theirs, seed + 1)
        fns = (ours.verify, theirs.verify)
    ours_us = timer(fns[0])
    sglang_us = timer(fns[1])
    if case.stage == "verify" and (ours.counters()[0] or theirs.counters()[0]):
        bad.append("violations while timed")
    return Row(
        case.stage, case.name, case.mode, world.entries, ours_us, sglang_us, not bad, "; ".join(bad)
    )


def run(
    sg: SglangOps,
    cases: tuple[Case, ...],
    sizes: Sizes,
    device: str,
    timer: Timer,
    out: Path | None,
) -> list[Row]:
    rows = []
    for i, case in enumerate(cases):
        t0 = time.perf_counter()
        rows.append(run_case(sg, case, sizes, device, timer, seed=1234 + i))
        print(
            f"# {case.stage} {case.name} {case.mode}: {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    print(table(rows))
    if out is not None:
        with open(out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(Row._fields + ("ratio",))
            for r in rows:
                w.writerow((*r, f"{r.ours_us / r.sglang_us:.3f}" if r.sglang_us else ""))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| stage | case | real-KV | verify entries | this project (us) | SGLang 0.5.23 CUDA (us) "
        "| ratio | same outputs |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = r.ours_us / r.sglang_us if r.sglang_us else float("nan")
        same = "yes" if r.equal else f"**no**: {r.detail}"
        lines.append(
            f"| {r.stage} | {r.case} | {r.mode} | {r.entries:,} | {r.ours_us:.1f} | "
            f"{r.sglang_us:.1f} | {ratio:.2f} | {same} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--only", choices=("plan", "write", "verify"), help="one stage")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("run_cuda_differential: needs CUDA (SGLang's kernels are CUDA-only)")
    try:
        sg = load_installed_sglang()
    except SglangUnavailable as err:
        raise SystemExit(f"run_cuda_differential: {err}") from err
    cases = tuple(c for c in GPU_CASES if args.only in (None, c.stage))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", file=sys.stderr)
    rows = run(
        sg, cases, GPU_SIZES, "cuda", lambda fn: gpu_time(fn, replays=args.replays), args.out
    )
    return 0 if all(r.equal for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
