"""Did a change make the write and verify kernels faster?

    python -m benchmarks.probes.kernels_vs_revisions REV [REV ...] [--rounds 3]
        [--geometry own|bench] [--stages write|verify|both]

GPU time of the write and verify kernels of several git revisions, side by side in one run.
Each revision's ``kv_canary_kernels`` is exported (``git archive``) into a temporary package
of its own and dispatched on the same inputs (validated once by the current
``kv_canary_buffers``); the current working tree's kernels run as ``HEAD``. Rounds are
interleaved so that drift hits every revision alike; each figure is the median over rounds
of a CUDA graph of ``--calls`` back-to-back launches timed with CUDA events (median of
``--replays`` replays). Records written by every revision are checked equal.

A REV may also be a directory holding a copy of a revision's ``kv_canary_kernels`` (where
the repository's history is not at hand: ``git archive REV kv_canary_kernels | tar -x``).
Revisions of either layout load, before and since the layout by stage (bf15e2c), and an
exported revision's ``compiled.py`` (which registers the ``kv_canary::*`` operators at
import, once per process) is replaced by a stand-in, so any revision can be compared
(``benchmarks/revisions.py``).

Cases: write decode 4096 x 1 and 256 x 1, mixed prefill 16 x 2048, long prefill 1 x 8192
(the chain-position check on, as in the benchmark), and 16 x 2048 with the write-input
check on (expected inputs equal to the inputs); verify after decode plans of 64, 256 and
4096 rows (prefix uniform in [1, 1023]), real-KV NONE and PARTIAL (two sources, K and V, 1
KB a token each, page size 1; runs before 2026-11-30T21:00 passed one tensor as both
sources). Needs CUDA and git.

Last answer (H200, 5b6e40b against a copy of 4c86cba's kernels, the kernels before issue
26, ``--stages both --rounds 3``, us): verify at 4096 rows 57.84 -> 58.18 (NONE) and 171.44
-> 171.52 (PARTIAL); write decode 4096 x 1 2.76 -> 2.91 (2.76 -> 2.86 with ``--stages write
--rounds 5``), mixed prefill 16 x 2048 227.96 -> 239.68, long prefill 1 x 8192 901.47 ->
948.63. The run: docs/history/2026-12-01-9-h200-suite-revisions-engine-share.md.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from benchmarks.harness import configure, gpu_time, logged
from benchmarks.revisions import export_kernels, stage_module
from kv_canary_buffers import (
    CanaryStore,
    PlanBuffers,
    RealKV,
    RealKVMode,
    plan_reference,
)
from kv_canary_buffers.verify import validate_verify_args
from kv_canary_buffers.write import validate_write_args
from kv_canary_kernels import launch_write

DEV = torch.device("cuda")


def export(rev: str, into: Path) -> tuple[ModuleType, ModuleType]:
    """``rev``'s write and verify modules, imported from a package of their own."""
    package = export_kernels(rev, into)
    return stage_module(package, "write"), stage_module(package, "verify")


class LegacyRealKV:
    """A ``RealKV`` as kernels from before per-source geometry read it (their
    ``sources.source_args``: ``sources`` as tensors sharing one ``page_size`` and
    ``bytes_per_token``). Weak-referenceable and hashed by identity, like ``RealKV``."""

    def __init__(self, real_kv: RealKV) -> None:
        geometry = {(s.page_size, s.bytes_per_token, s.read_bytes) for s in real_kv.sources}
        assert len(geometry) == 1, "the old kernels take one geometry for every source"
        self.sources = tuple(s.tensor for s in real_kv.sources)
        self.mode = real_kv.mode
        ((self.page_size, self.bytes_per_token, read_bytes),) = geometry
        # bytes hashed per slot and source, as the old RealKV.hashed_bytes
        self.hashed_bytes = {RealKVMode.NONE: 0, RealKVMode.PARTIAL: 16}.get(self.mode, read_bytes)


def args_for(verify: ModuleType, validated):
    """``validated`` as ``verify``'s revision reads it: a ``LegacyRealKV`` for a revision
    whose source arguments predate the source table."""
    sources = importlib.import_module(verify.__name__.rsplit(".", 1)[0] + ".sources")
    if validated.real_kv is None or "table" in sources.SourceArgs._fields:
        return validated
    return validated._replace(real_kv=LegacyRealKV(validated.real_kv))


def write_case(rows: int, length: int, expected: bool = False):
    g = torch.Generator().manual_seed(rows)
    n = rows * length
    num_slots = n + rows + 1
    perm = torch.randperm(num_slots, generator=g)
    plan = PlanBuffers.allocate(write_req_capacity=rows, verify_capacity=1, device=DEV)
    plan.write_num_valid_reqs.fill_(rows)
    plan.write_offsets.copy_(torch.arange(rows + 1) * length)
    plan.write_seed_slot_indices.copy_(perm[:rows])
    step = dict(
        input_ids=torch.randint(0, 50000, (n,), generator=g).to(DEV),
        # Each row continues its seed's record (position 0 in a zeroed store): the
        # chain-position check, on as in the benchmark, finds nothing.
        positions=(torch.arange(n) % length + 1).to(DEV),
        out_cache_loc=perm[rows : rows + n].to(DEV),
    )
    if expected:  # the write-input check on, every token as expected
        step["expected_input_ids"] = step["input_ids"].clone()
        step["expected_positions"] = step["positions"].clone()
    store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=DEV)
    store.enable_chain_position_check()
    return store, plan, validate_write_args(store, plan, **step)


def verify_case(bs: int, mode: RealKVMode):
    """A decode plan of ``bs`` rows whose prefixes were written by the current kernels."""
    g = torch.Generator().manual_seed(bs)
    cols = 1032
    num_slots = (bs + 1) * cols + 1
    table = (torch.randperm((bs + 1) * cols, generator=g) + 1).reshape(bs + 1, cols)
    table = table.to(torch.int32).to(DEV)
    prefix = torch.randint(1, 1024, (bs,), generator=g).to(DEV)
    rows = torch.arange(1, bs + 1, device=DEV)
    plan = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 1024, device=DEV)
    plan_reference(
        plan,
        req_pool_indices=rows,
        prefix_lens=prefix,
        extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=DEV),
        req_to_token=table,
    )
    store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=1024, device=DEV)
    real_kv = None
    if mode != RealKVMode.NONE:
        # K and V: two tensors (one tensor twice would read each slot's sector once)
        k, v = (torch.randint(-9, 9, (num_slots, 512), device=DEV).to(torch.bfloat16) for _ in "kv")
        real_kv = RealKV(mode=mode, sources=(k, v), page_size=1, bytes_per_token=1024)
    wplan = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=1, device=DEV)
    plan_reference(
        wplan,
        req_pool_indices=rows,
        prefix_lens=torch.zeros_like(prefix),
        extend_seq_lens=prefix,
        req_to_token=table,
    )
    total = int(prefix.sum())
    row_of = torch.repeat_interleave(torch.arange(bs, device=DEV), prefix)
    start = torch.cumsum(prefix, 0) - prefix
    pos = torch.arange(total, device=DEV) - start[row_of]
    launch_write(
        store,
        wplan,
        input_ids=torch.randint(0, 1000, (total,), device=DEV),
        positions=pos,
        out_cache_loc=table[rows[row_of], pos].long(),
        real_kv=real_kv,
    )
    torch.cuda.synchronize()
    assert store.take_violations().appended == 0
    args = validate_verify_args(store, plan, check_expected_tokens=False, real_kv=real_kv)
    return store, plan, args


def bench_verify_case(bs: int, mode: RealKVMode):
    """The benchmark's own verify case (``canary_cases.World``, seed ``bs``, SWA off):
    capacity equal to the entries, expected tokens checked, K and V of 256 bytes a slot."""
    from benchmarks.canary_cases import GPU_SIZES, World

    world = World(bs, GPU_SIZES.prefix, 1, 0, "cuda", seed=bs)
    plan = world.plan()
    real_kv = world.sources(mode.name, GPU_SIZES, seed=bs)
    store = world.new_store(real_kv)
    args = validate_verify_args(store, plan, check_expected_tokens=True, real_kv=real_kv)
    return store, plan, args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "revs", nargs="+", help="git revisions (or copies of their kv_canary_kernels) to compare"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument(
        "--geometry",
        choices=("own", "bench"),
        default="own",
        help="verify cases: this script's own (capacity 1024 a row, tokens not checked, "
        "1 KB a slot) or the benchmark's (capacity equal to the entries, tokens checked, 256 B a "
        "slot); bench also skips the write cases",
    )
    parser.add_argument(
        "--stages",
        choices=("write", "verify", "both"),
        default="both",
        help="which kernels to compare (each verify case compiles two variants a revision)",
    )
    args = parser.parse_args(argv)
    configure("cuda", smoke=False)
    import kv_canary_kernels.verify as head_verify
    import kv_canary_kernels.write as head_write

    with tempfile.TemporaryDirectory() as tmp:
        versions = {rev: export(rev, Path(tmp)) for rev in args.revs}
        versions["HEAD"] = (head_write, head_verify)
        cases = []
        if args.geometry == "own" and args.stages != "verify":
            for rows, length in [(4096, 1), (256, 1), (16, 2048), (1, 8192)]:
                cases.append((f"write {rows} x {length}", "write", write_case(rows, length)))
            cases.append(
                ("write 16 x 2048, expected inputs", "write", write_case(16, 2048, expected=True))
            )
        verify_of = verify_case if args.geometry == "own" else bench_verify_case
        for bs in (64, 256, 4096) if args.stages != "write" else ():
            for mode in (RealKVMode.NONE, RealKVMode.PARTIAL):
                cases.append((f"verify bs={bs} {mode.name}", "verify", verify_of(bs, mode)))
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
        print("| case | " + " | ".join(versions) + " |")
        print("|---" * (len(versions) + 1) + "|")
        for label, stage, (store, plan, validated) in cases:
            times: dict[str, list[float]] = {v: [] for v in versions}
            records = {}
            for _ in range(args.rounds):
                for name, (write, verify) in versions.items():
                    if stage == "write":
                        store.records.zero_()
                        fn = lambda w=write: w.dispatch_write(store, plan, validated)  # noqa: E731
                    else:
                        given = args_for(verify, validated)
                        fn = lambda v=verify, a=given: v.dispatch_verify(store, plan, a)  # noqa: E731
                    times[name].append(gpu_time(fn, args.replays, args.calls).us)
                    torch.cuda.synchronize()
                    records[name] = store.records.clone()
            first = next(iter(records.values()))
            assert all(torch.equal(first, r) for r in records.values()), label
            assert store.take_violations().appended == 0, label
            meds = " | ".join(f"{statistics.median(t):.2f}" for t in times.values())
            print(f"| {label} | {meds} |", flush=True)
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())
