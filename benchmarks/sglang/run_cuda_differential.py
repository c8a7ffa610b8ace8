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
SGLang's runtime is not imported: ``load_installed_sglang`` executes only
``sglang.kernels.ops.kv_canary`` and its JIT loader, with the parent packages stubbed.
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
import importlib
import importlib.util
import statistics
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kv_canary_buffers import (
    CanaryStore,
    PlanBuffers,
    RealKV,
    RealKVMode,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write

I64, I32, U8 = torch.int64, torch.int32, torch.uint8
RING = 1024
TAG = 2  # CanaryLaunchTag.TAIL_K_FULL: any tag, the same on both sides
FLIPPED = 64


# --- SGLang's side ----------------------------------------------------------------------
@dataclass(frozen=True)
class SglangOps:
    """What this script uses of SGLang's kv-canary: its classes and three launchers
    (``launch_canary_plan_kernels``, ``launch_canary_write_kernel``,
    ``launch_canary_verify_kernel``), or anything with their signatures (the torch
    references, in the CPU smoke test)."""

    consts: Any
    VerifyPlan: Any
    WritePlan: Any
    VerifyOrWriteContext: Any
    RealKvSource: Any
    CanaryLaunchTag: Any
    plan: Callable[..., None]
    write: Callable[..., None]
    verify: Callable[..., None]


def _stub(name: str, path: Path | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []
    return module


def load_installed_sglang() -> SglangOps:
    """SGLang's CUDA launchers from an installed wheel (``PYTHONPATH``), without running
    ``sglang/__init__.py`` (SGLang's whole runtime and its dependencies) or the kernel
    registry: the parent packages are stand-ins whose ``__path__`` is the wheel's, and
    ``sglang.srt.utils.common`` (imported by the JIT loader for two helpers) is replaced by
    those two helpers."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "run_cuda_differential: no sglang package on the path; install the wheels of "
            "scripts/download-sglang-wheels.sh with --target DIR and set PYTHONPATH=DIR:."
        )
    base = Path(next(iter(spec.submodule_search_locations)))
    for name, path in {
        "sglang": base,
        "sglang.kernels": base / "kernels",
        "sglang.kernels.ops": base / "kernels" / "ops",
        "sglang.kernels.ops.kv_canary": base / "kernels" / "ops" / "kv_canary",
        "sglang.srt": base / "srt",
        "sglang.srt.utils": base / "srt" / "utils",
    }.items():
        sys.modules[name] = _stub(name, path)
    common = _stub("sglang.srt.utils.common", None)
    common.is_cuda = torch.cuda.is_available  # type: ignore[attr-defined]
    common.get_cuda_version = lambda: tuple(  # type: ignore[attr-defined]
        int(x) for x in (torch.version.cuda or "0.0").split(".")
    )
    sys.modules["sglang.srt.utils.common"] = common
    utils = _stub("sglang.utils", None)
    utils.is_in_ci = lambda: False  # type: ignore[attr-defined]
    sys.modules["sglang.utils"] = utils
    pkg = "sglang.kernels.ops.kv_canary"
    consts = importlib.import_module(f"{pkg}.consts")
    verify = importlib.import_module(f"{pkg}.verify")
    write = importlib.import_module(f"{pkg}.write")
    plan = importlib.import_module(f"{pkg}.plan.api")
    return SglangOps(
        consts=consts,
        VerifyPlan=verify.VerifyPlan,
        WritePlan=write.WritePlan,
        VerifyOrWriteContext=verify.VerifyOrWriteContext,
        RealKvSource=verify.RealKvSource,
        CanaryLaunchTag=verify.CanaryLaunchTag,
        plan=plan.launch_canary_plan_kernels,
        write=write.launch_canary_write_kernel,
        verify=verify.launch_canary_verify_kernel,
    )


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

    def sglang_sources(self, sg: SglangOps) -> tuple[Any, ...]:
        return tuple(
            sg.RealKvSource(
                tensor=t,
                page_size=1,
                num_bytes_per_token=self.bytes_per_token,
                read_bytes=self.bytes_per_token,
            )
            for t in self.kv
        )


# --- one side each ---------------------------------------------------------------------------
class Ours:
    def __init__(self, world: World, verify_capacity: int):
        dev = world.device
        self.world = world
        self.plan_buffers = PlanBuffers.allocate(
            write_req_capacity=world.bs, verify_capacity=verify_capacity, device=dev
        )
        self.store = CanaryStore.allocate(
            num_slots=world.num_slots, violation_capacity=RING, device=dev
        )
        self.store.enable_chain_position_check()
        self.real_kv = world.real_kv()

    def plan(self, kw: dict[str, Any]) -> None:
        launch_plan(self.plan_buffers, **kw)

    def write(self, tokens: dict[str, torch.Tensor]) -> None:
        launch_write(self.store, self.plan_buffers, launch_tag=TAG, real_kv=self.real_kv, **tokens)

    def verify(self) -> None:
        launch_verify(self.store, self.plan_buffers, launch_tag=TAG, real_kv=self.real_kv)

    def counters(self) -> tuple[int, int, int]:
        s = self.store
        return int(s.violation_count), int(s.kernel_runs), int(s.slots_processed)

    def rows(self) -> Counter[tuple[int, ...]]:
        n = min(int(self.store.violation_count), RING)
        # SGLang's 8 columns (this project may keep more beside them).
        return Counter(tuple(r) for r in self.store.violations[:n, :8].tolist())

    def clear(self) -> None:
        self.store.take_violations()


class Theirs:
    def __init__(self, sg: SglangOps, world: World, verify_capacity: int):
        dev = world.device
        self.sg, self.world = sg, world
        self.verify_plan = sg.VerifyPlan.allocate(verify_capacity=verify_capacity, device=dev)
        self.write_plan = sg.WritePlan.allocate(write_req_capacity=world.bs, device=dev)
        self.buf = torch.zeros(world.num_slots, 32, dtype=U8, device=dev)
        self.ring = torch.zeros(RING, 8, dtype=I64, device=dev)
        self.index = torch.zeros(1, dtype=I32, device=dev)
        self.slot_runs = torch.zeros(1, dtype=I64, device=dev)
        self.kernel_runs = torch.zeros(1, dtype=I64, device=dev)
        self.chain = torch.ones(1, dtype=I32, device=dev)
        self.context = sg.VerifyOrWriteContext(
            canary_buf=self.buf,
            kernel_kind=sg.CanaryLaunchTag(TAG),
            violation_ring=self.ring,
            violation_write_index=self.index,
            slot_run_counter=self.slot_runs,
            kernel_run_counter=self.kernel_runs,
            real_kv_sources=world.sglang_sources(sg),
            real_kv_hash_mode=sg.consts.RealKvHashMode[world.case.mode],
            enable_chain_position_assert=self.chain,
        )

    def plan(self, kw: dict[str, Any]) -> None:
        self.sg.plan(
            verify_plan_out=self.verify_plan,
            write_plan_out=self.write_plan,
            verify_capacity=int(self.verify_plan.verify_slot_indices.shape[0]),
            **kw,
        )

    def write(self, tokens: dict[str, torch.Tensor]) -> None:
        self.sg.write(
            context=self.context,
            plan=self.write_plan,
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
            **tokens,
        )

    def verify(self) -> None:
        self.sg.verify(
            context=self.context, plan=self.verify_plan, check_verify_expected_token=True
        )

    def counters(self) -> tuple[int, int, int]:
        return int(self.index), int(self.kernel_runs), int(self.slot_runs)

    def rows(self) -> Counter[tuple[int, ...]]:
        n = min(int(self.index), RING)
        return Counter(tuple(r) for r in self.ring[:n].tolist())

    def clear(self) -> None:
        self.ring.zero_()
        self.index.zero_()


def plans_differ(ours: Ours, theirs: Theirs, bs: int) -> list[str]:
    b, vp, wp = ours.plan_buffers, theirs.verify_plan, theirs.write_plan
    bad = []
    if not torch.equal(b.write_offsets, wp.write_offsets):
        bad.append("write_offsets")
    if not torch.equal(b.write_seed_slot_indices[:bs], wp.write_seed_slot_indices[:bs]):
        bad.append("write_seed_slot_indices")
    for mine, name in (
        (b.write_num_valid_reqs, "write_num_valid_reqs"),
        (b.verify_num_valid, "verify_num_valid"),
    ):
        their = wp.write_num_valid_reqs if name.startswith("write") else vp.verify_num_valid
        if int(mine) != int(their):
            bad.append(name)
    if int(b.verify_enable) != int(vp.enable):
        bad.append("verify_enable")
    n = int(vp.verify_num_valid)
    if int(vp.enable):
        for f in ("slot_indices", "expected_tokens", "expected_positions", "prev_slot_indices"):
            if not torch.equal(getattr(b, f"verify_{f}")[:n], getattr(vp, f"verify_{f}")[:n]):
                bad.append(f"verify_{f}")
    return bad


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
    ours, theirs = Ours(world, cv), Theirs(sg, world, cv)
    bad: list[str] = []

    # The prefill of every prefix, each side from its own plan.
    if world.entries:
        for side in (ours, theirs):
            side.plan(world.fill_kwargs)
            side.write(world.fill_inputs)
        bad += [f"fill plan: {f}" for f in plans_differ(ours, theirs, world.bs)]
        if not torch.equal(ours.store.records.view(U8), theirs.buf):
            bad.append("fill records")
        if ours.counters() != theirs.counters() or ours.counters()[0]:
            bad.append(f"fill counters {ours.counters()} vs {theirs.counters()}")
    # The step's plan.
    for side in (ours, theirs):
        side.plan(world.plan_kwargs)
    bad += [f"plan: {f}" for f in plans_differ(ours, theirs, world.bs)]
    if int(ours.plan_buffers.verify_num_valid) != world.entries:
        bad.append("plan: not every entry")

    fns: tuple[Callable[[], None], Callable[[], None]]
    if case.stage == "plan":
        fns = (lambda: ours.plan(world.plan_kwargs), lambda: theirs.plan(world.plan_kwargs))
    elif case.stage == "write":
        for side in (ours, theirs):
            side.write(world.step_inputs)
        if not torch.equal(ours.store.records.view(U8), theirs.buf):
            bad.append("write records")
        if ours.counters() != theirs.counters() or ours.counters()[0]:
            bad.append(f"write counters {ours.counters()} vs {theirs.counters()}")
        fns = (lambda: ours.write(world.step_inputs), lambda: theirs.write(world.step_inputs))
    else:
        for side in (ours, theirs):
            side.verify()
        if ours.counters() != theirs.counters() or ours.counters()[0]:
            bad.append(f"verify counters {ours.counters()} vs {theirs.counters()}")
        # Corrupted: the same positions flipped in both stores, the same rows reported.
        clean = ours.store.records.clone()
        n = int(ours.plan_buffers.verify_num_valid)
        g = torch.Generator().manual_seed(seed + 1)
        pick = torch.randperm(n, generator=g)[:FLIPPED].to(device)
        slots = ours.plan_buffers.verify_slot_indices[pick].unique()
        flip = torch.zeros_like(clean)
        flip[slots, 1] = 1 << 20
        for records in (ours.store.records, theirs.buf.view(I64)):
            records.copy_(clean ^ flip)
        for side in (ours, theirs):
            side.clear()
            side.verify()
        rows = ours.rows()
        if rows != theirs.rows() or ours.counters()[0] != theirs.counters()[0] or not rows:
            bad.append(f"corrupted verify: {ours.counters()[0]} vs {theirs.counters()[0]} rows")
        for side in (ours, theirs):
            side.clear()
        ours.store.records.copy_(clean)
        theirs.buf.view(I64).copy_(clean)
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
    sg = load_installed_sglang()
    cases = tuple(c for c in GPU_CASES if args.only in (None, c.stage))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", file=sys.stderr)
    rows = run(
        sg, cases, GPU_SIZES, "cuda", lambda fn: gpu_time(fn, replays=args.replays), args.out
    )
    return 0 if all(r.equal for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
