"""The write, verify and step stages' cases (``python -m benchmarks --stage write|verify|step``).

Every case is a *world*: a batch of requests whose KV slots are a random permutation of
the pool (``req_to_token``, and under SWA a LUT that is another permutation), a token pool
of expected tokens, and a :class:`CanaryStore` whose records hold the requests' prefixes:
written by ``launch_write`` over a prefill of every prefix (with the case's real-KV
sources), so that a verify of the prefix finds nothing. Each timed implementation is
checked afterwards: no violation appended and no status bit raised (a benchmark of a
kernel that appends violations would measure the wrong thing).

- verify: after a decode plan (one new token a row, prefix uniform in [1, 1023], mean
  512) of 64, 256 and 4096 rows, SWA off and on (W = 128 with a LUT), real-KV NONE and
  PARTIAL (K and V of one layer, page size 1, 256 bytes a token), and at 4096 rows without
  SWA mode ALL (K and V, 1 KB a token each, read whole: 2 KB a slot). Beside
  ``launch_verify``: a torch-only verify captured in a graph, the traffic-only kernel, the
  same reading the predecessor's record too (SGLang's verify does), and the bandwidth
  floor; where they load, SGLang's own verify (``sglang_cuda``, checked against ours first).
- write: decode (4096 and 256 rows x 1 token), mixed prefill (16 rows x 2048 tokens,
  prefixes as above: a chunked prefill seeded from its prefix), long prefill (1 row x 8192
  tokens, no prefix), real-KV NONE, the chain-position check on. Beside ``launch_write``:
  the torch reference (eager: its serial chain is a Python loop over token steps with
  syncs), the traffic-only kernel and the bandwidth floor; where they load, SGLang's own
  write (``sglang_cuda``, checked against ours first).
- step: plan + verify + write of a decode step (64, 256, 4096 rows, SWA off and on, NONE):
  GPU time of the whole step in a graph, host time of each launcher and of the step
  (validated against the bare dispatch) and device allocations over 100 steps.
- sources (``benchmarks/probes/real_kv_sources.py``, not part of ``python -m
  benchmarks``: its pool takes most of an H200): verify and write of a decode step at
  4096 rows (SWA off) with 1, 2, 8, 32, 128 and 256 real-KV sources, each a layer's K or
  V of one bf16 pool ``[layers, 2, slots, 64 bytes]`` (page size 1), modes PARTIAL and
  ALL: GPU time in a graph, host time of each launcher against its bare dispatch.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch

from benchmarks.canary_baselines import (
    TorchVerify,
    multiset,
    verify_bytes,
    verify_traffic,
    verify_traffic_expected,
    verify_traffic_grid,
    write_bytes,
    write_traffic,
    write_traffic_expected,
    write_traffic_grid,
)
from benchmarks.harness import (
    ENV,
    HostTime,
    Recorder,
    count_allocations,
    eager_wall_us,
    gpu_time,
    guarded,
    host_calls_for,
    host_time_stats_us,
    on_gpu,
    value_of,
)
from kv_canary_buffers import (
    CanaryStore,
    PlanBuffers,
    RealKV,
    RealKVMode,
    RealKVSource,
    plan_reference,
    plans_equal,
    validate_plan_args,
    verify_entries_needed,
    verify_reference,
    write_reference,
)
from kv_canary_buffers.verify import validate_verify_args
from kv_canary_buffers.write import validate_write_args
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from kv_canary_kernels.plan import dispatch_plan
from kv_canary_kernels.verify import dispatch_verify
from kv_canary_kernels.write import dispatch_write

VIOLATION_CAPACITY = 1024
HOST_TARGET_US = 30.0
"""Issue 9: host time per eager call of every launcher."""
VERIFY_TAG, WRITE_TAG, TORCH_TAG = 1, 2, 3


class WriteCase(NamedTuple):
    kind: str
    rows: int
    tokens: int
    """New tokens a row."""
    prefix: tuple[int, int]
    """Prefix lengths, uniform in this closed range."""
    target_us: float


class Sizes(NamedTuple):
    prefix: tuple[int, int]
    window: int
    verify: tuple[tuple[int, float, float], ...]
    """(rows, target NONE, target PARTIAL) in us."""
    verify_all: tuple[int, float]
    """(rows, target) of mode ALL, SWA off."""
    write: tuple[WriteCase, ...]
    step: tuple[int, ...]
    partial_bytes_per_token: int
    all_bytes_per_token: int
    """Per source (K and V), read whole in mode ALL."""


GPU_SIZES = Sizes(
    prefix=(1, 1023),
    window=128,
    verify=((64, 4.0, 5.0), (256, 6.0, 8.0), (4096, 60.0, 100.0)),
    verify_all=(4096, 1400.0),
    write=(
        WriteCase("decode", 4096, 1, (1, 1023), 3.0),
        WriteCase("decode", 256, 1, (1, 1023), 2.5),
        WriteCase("mixed prefill", 16, 2048, (1, 1023), 200.0),
        WriteCase("long prefill", 1, 8192, (0, 0), 700.0),
    ),
    step=(64, 256, 4096),
    partial_bytes_per_token=256,
    all_bytes_per_token=1024,
)
"""The cases and targets of issue 9."""

SMOKE_SIZES = Sizes(
    prefix=(1, 23),
    window=4,
    verify=((9, 6.0, 8.0),),
    verify_all=(9, 1400.0),
    write=(
        WriteCase("decode", 9, 1, (1, 23), 3.0),
        WriteCase("mixed prefill", 2, 16, (1, 23), 200.0),
        WriteCase("long prefill", 1, 24, (0, 0), 700.0),
    ),
    step=(9,),
    partial_bytes_per_token=32,
    all_bytes_per_token=64,
)
"""Tiny cases for the interpreter: every code path of the GPU run, same shapes of data."""


# --- worlds ------------------------------------------------------------------------------
class World:
    """A batch, its tables and the step's write inputs (see the module docstring)."""

    def __init__(
        self, bs: int, prefix: tuple[int, int], extend: int, window: int, device: str, seed: int
    ):
        g = torch.Generator().manual_seed(seed)
        lo, hi = prefix
        P = torch.randint(lo, hi + 1, (bs,), generator=g)
        cols = hi + extend + 8
        rows = bs + 1
        slots = rows * cols
        # Slots 1..N in random order (slot 0 is the pool's padding slot, never used).
        table = (torch.randperm(slots, generator=g) + 1).reshape(rows, cols).to(torch.int32)
        rp = torch.randperm(bs, generator=g) + 1
        E = torch.full((bs,), extend, dtype=torch.int64)
        pool = torch.randint(0, 150_000, (rows, cols), generator=g, dtype=torch.int32)
        lut = None
        if window > 0:
            lut = torch.cat(
                [torch.zeros(1, dtype=torch.int64), torch.randperm(slots, generator=g) + 1]
            )
        self.bs, self.window, self.extend, self.device = bs, window, extend, device
        self.num_slots = slots + 1
        self.entries = verify_entries_needed(P, req_pool_indices=rp, swa_window_size=window)
        self.n = bs * extend
        self.seeded_rows = int(((P > 0) & (E > 0)).sum())
        self.prefix_tokens = int(P.sum())

        def tokens(start: torch.Tensor, count: torch.Tensor) -> dict[str, torch.Tensor]:
            row = torch.repeat_interleave(torch.arange(bs), count)
            first = torch.cumsum(count, 0) - count
            pos = start[row] + torch.arange(int(count.sum())) - first[row]
            r = rp[row]
            slot = table[r, pos].long()
            if lut is not None:
                slot = lut[slot]
            return {
                "input_ids": pool[r, pos].long().to(device),
                "positions": pos.to(device),
                "out_cache_loc": slot.to(device),
            }

        def on(d: dict) -> dict:
            return {
                k: v.to(device) if isinstance(v, torch.Tensor) else v
                for k, v in d.items()
                if v is not None
            }

        self.plan_kwargs = on(
            dict(
                req_pool_indices=rp,
                prefix_lens=P,
                extend_seq_lens=E,
                req_to_token=table,
                swa_window_size=window,
                full_to_swa_index_mapping=lut,
                req_to_verify_expected_tokens=pool,
                req_to_verify_expected_tokens_valid_lens=P + extend,
            )
        )
        # The prefill that wrote every prefix: no prefix, P new tokens a row.
        self.fill_kwargs = on(
            dict(
                req_pool_indices=rp,
                prefix_lens=torch.zeros_like(P),
                extend_seq_lens=P,
                req_to_token=table,
                swa_window_size=window,
                full_to_swa_index_mapping=lut,
            )
        )
        self.fill_inputs = tokens(torch.zeros_like(P), P)
        self.step_inputs = tokens(P, E)

    def sources(self, mode: str, sizes: Sizes, seed: int) -> RealKV | None:
        """K and V of one layer (page size 1, bf16, random bytes) for ``mode``."""
        if mode == "NONE":
            return None
        bpt = sizes.partial_bytes_per_token if mode == "PARTIAL" else sizes.all_bytes_per_token
        torch.manual_seed(seed)
        kv = [
            torch.empty((self.num_slots, bpt // 8), dtype=torch.int64, device=self.device)
            .random_()
            .view(torch.bfloat16)
            for _ in range(2)
        ]
        return RealKV(mode=RealKVMode[mode], sources=tuple(kv), page_size=1, bytes_per_token=bpt)

    def new_store(self, real_kv: RealKV | None, *, check_fill: bool = False) -> CanaryStore:
        """A store whose records hold every prefix, written by ``launch_write`` (and, with
        ``check_fill``, compared with ``write_reference``'s)."""
        store = CanaryStore.allocate(
            num_slots=self.num_slots, violation_capacity=VIOLATION_CAPACITY, device=self.device
        )
        if self.prefix_tokens == 0:
            return store
        fill = PlanBuffers.allocate(
            write_req_capacity=self.bs, verify_capacity=1, device=self.device
        )
        plan_reference(fill, **self.fill_kwargs)
        launch_write(store, fill, real_kv=real_kv, **self.fill_inputs)
        expect_clean(store, "the fill (launch_write over every prefix)")
        if check_fill:
            ref = CanaryStore.allocate(
                num_slots=self.num_slots, violation_capacity=VIOLATION_CAPACITY, device=self.device
            )
            write_reference(ref, fill, real_kv=real_kv, **self.fill_inputs)
            if not torch.equal(ref.records, store.records):
                raise AssertionError(
                    "the fill: launch_write's records differ from write_reference's"
                )
        return store

    def plan(self) -> PlanBuffers:
        """The step's plan by ``launch_plan``, checked equal to ``plan_reference``'s."""
        buffers = PlanBuffers.allocate(
            write_req_capacity=self.bs, verify_capacity=max(self.entries, 1), device=self.device
        )
        launch_plan(buffers, **self.plan_kwargs)
        ref = PlanBuffers.allocate(
            write_req_capacity=self.bs, verify_capacity=max(self.entries, 1), device=self.device
        )
        plan_reference(ref, **self.plan_kwargs)
        if not plans_equal(buffers, ref, self.bs):
            raise AssertionError(f"launch_plan differs from plan_reference at bs={self.bs}")
        if int(buffers.verify_num_valid) != self.entries or int(buffers.verify_enable) != 1:
            raise AssertionError("the plan does not hold every verify entry")
        return buffers


def expect_clean(store: CanaryStore, after: str) -> int:
    """Raise unless the store holds no violation and no status bit (both are cleared, so a
    later check starts afresh); returns the number of violations (0)."""
    count = int(store.violation_count.item())
    status = int(store.status.item())
    if count or status:
        report = store.take_violations()
        store.take_status()
        shown = "; ".join(str(v) for v in report.violations[:3])
        raise AssertionError(
            f"after {after}: {count} violations, status {status:#x} (expected none): {shown}"
        )
    return count


def check_violations_equal(a: CanaryStore, b: CanaryStore, what: str, ordered: bool) -> None:
    """Same ring (as a multiset unless ``ordered``), count and counters."""
    ka, kb = int(a.violation_count), int(b.violation_count)
    rows_a = a.violations[: min(ka, a.violation_capacity)].tolist()
    rows_b = b.violations[: min(kb, b.violation_capacity)].tolist()
    same_rows = rows_a == rows_b if ordered else multiset(rows_a) == multiset(rows_b)
    if not (
        ka == kb
        and same_rows
        and torch.equal(a.kernel_runs, b.kernel_runs)
        and torch.equal(a.slots_processed, b.slots_processed)
    ):
        raise AssertionError(
            f"{what}: violations or counters differ ({ka} vs {kb} rows; runs "
            f"{int(a.kernel_runs)} vs {int(b.kernel_runs)}; processed "
            f"{int(a.slots_processed)} vs {int(b.slots_processed)})"
        )


def register_target(
    rec: Recorder, stage: str, section: str, impl: str, limit: float, **case
) -> None:
    """A target row: ``impl``'s value in ``section`` for this case must be <= ``limit``."""
    rec.add("target", impl, "max_us", limit, stage=stage, note=section, **case)


# --- verify -------------------------------------------------------------------------------
def bench_verify(
    rec: Recorder, sizes: Sizes, replays: int, host_calls: int, bandwidth: float, sglang=None
) -> None:
    """``sglang``: SGLang's ops (``benchmarks.sglang_cuda.SglangOps``) for the
    ``sglang_cuda`` column, or None."""
    rec.stage = "verify"
    all_bs, all_target = sizes.verify_all
    for bs, target_none, target_partial in sizes.verify:
        for window in (0, sizes.window):
            modes = [("NONE", target_none), ("PARTIAL", target_partial)]
            if bs == all_bs and window == 0:
                modes.append(("ALL", all_target))
            world: list[World] = []
            buffers: list[PlanBuffers] = []

            def build() -> None:
                world.append(World(bs, sizes.prefix, 1, window, ENV.device, seed=bs + window))
                buffers.append(world[0].plan())

            if not guarded(rec, f"verify world bs={bs} swa={window}", build):
                continue
            for mode, target in modes:
                guarded(
                    rec,
                    f"verify bs={bs} swa={window} {mode}",
                    lambda: verify_case(
                        rec,
                        world[0],
                        buffers[0],
                        mode,
                        target,
                        sizes,
                        replays,
                        host_calls,
                        bandwidth,
                        sglang,
                    ),
                )
                _free()
            world.clear()
            buffers.clear()
            _free()


def verify_case(
    rec: Recorder,
    world: World,
    buffers: PlanBuffers,
    mode: str,
    target: float,
    sizes: Sizes,
    replays: int,
    host_calls: int,
    bandwidth: float,
    sglang=None,
) -> None:
    entries = world.entries
    case = dict(
        case=f"bs={world.bs} swa={world.window} {mode}",
        bs=world.bs,
        swa=world.window,
        pool=1,
        entries=entries,
        real_kv=mode,
    )
    real_kv = world.sources(mode, sizes, seed=world.bs)
    store = world.new_store(real_kv, check_fill=ENV.smoke)

    def verify() -> None:
        launch_verify(store, buffers, launch_tag=VERIFY_TAG, real_kv=real_kv)

    torch_verify = TorchVerify(store, buffers, launch_tag=TORCH_TAG, real_kv=real_kv)
    if ENV.smoke:
        guarded(
            rec,
            f"verify smoke checks {case['case']}",
            lambda: smoke_verify_checks(world, buffers, store, real_kv),
        )

    def timed(name: str, fn) -> None:
        # Once eagerly: nothing found, every entry looked at; then timed; then still clean.
        before = int(store.slots_processed)
        fn()
        expect_clean(store, f"one {name}")
        if int(store.slots_processed) - before != entries:
            raise AssertionError(
                f"{name} looked at {int(store.slots_processed) - before} "
                f"entries, expected {entries}"
            )
        t = gpu_time(fn, replays)
        rec.add(
            "gpu_time",
            name,
            "us_per_call",
            t.us,
            replays=t.replays,
            calls_per_graph=t.calls_per_graph,
            **case,
        )
        rec.add(
            "check", name, "violations_after_timing", expect_clean(store, f"timing {name}"), **case
        )

    if sglang is not None:  # before any timing: SGLang's side starts from the fill, as ours
        guarded(
            rec,
            f"verify sglang_cuda {case['case']}",
            lambda: sglang_verify_case(rec, sglang, world, store, real_kv, case, replays),
        )
    guarded(rec, f"verify launch_verify {case['case']}", lambda: timed("launch_verify", verify))
    guarded(rec, f"verify torch_only {case['case']}", lambda: timed("torch_only", torch_verify))

    sink = torch.zeros(verify_traffic_grid(entries, real_kv), dtype=torch.int64, device=ENV.device)
    for name, both, on_device in (
        ("traffic_only", False, False),
        ("traffic_device_count", False, True),
        ("traffic_both_records", True, False),
    ):

        def traffic(both=both, on_device=on_device) -> None:
            verify_traffic(
                store,
                buffers,
                entries,
                sink,
                real_kv=real_kv,
                both_records=both,
                count_on_device=on_device,
            )

        def run_traffic(name=name, both=both, traffic=traffic) -> None:
            traffic()
            want = verify_traffic_expected(
                store, buffers, entries, real_kv=real_kv, both_records=both
            )
            if not torch.equal(sink.sum(), want):
                raise AssertionError(f"{name}: the kernel's sums differ from torch's")
            t = gpu_time(traffic, replays)
            rec.add(
                "gpu_time",
                name,
                "us_per_call",
                t.us,
                replays=t.replays,
                calls_per_graph=t.calls_per_graph,
                **case,
            )

        guarded(rec, f"verify {name} {case['case']}", run_traffic)
    rec.add(
        "gpu_time",
        "bandwidth_floor",
        "us_per_call",
        verify_bytes(entries, real_kv) / bandwidth * 1e6,
        **case,
    )
    register_target(rec, "verify", "gpu_time", "launch_verify", target, **case)

    def host() -> None:
        args = validate_verify_args(
            store, buffers, launch_tag=VERIFY_TAG, check_expected_tokens=True, real_kv=real_kv
        )
        gpu_us = value_of(
            rec.rows, stage="verify", section="gpu_time", impl="launch_verify", case=case["case"]
        )
        times = host_time_stats_us(
            {
                "launch_verify": verify,
                "bare_dispatch": lambda: dispatch_verify(store, buffers, args),
            },
            host_calls_for(gpu_us, host_calls),
        )
        record_host(rec, "launch_verify", times["launch_verify"], times["bare_dispatch"], case)
        allocations = count_allocations(verify)
        if allocations is not None:
            rec.add("alloc", "launch_verify", "allocations_per_100", allocations, **case)
        expect_clean(store, "the host timing of launch_verify")

    guarded(rec, f"verify host {case['case']}", host)


def sglang_verify_case(
    rec: Recorder,
    sglang,
    world: World,
    store: CanaryStore,
    real_kv: RealKV | None,
    case: dict,
    replays: int,
) -> None:
    """SGLang's verify of the case beside ``launch_verify``'s (``benchmarks.sglang_cuda``):
    each side writes the fill from its own plan (records byte for byte) and plans the step
    (SGLang's plan fields against ``launch_plan``'s); both verify the clean records (nothing
    reported, the same counters) and a copy with up to 64 verified slots corrupted (the
    same violation rows); then SGLang's verify is timed as ``launch_verify`` is and must
    stay clean. Ours runs on a copy of the case's store. Beyond SGLang's limits (real-KV
    sources), an absent cell."""
    from benchmarks.sglang_cuda import sources_limit, verify_and_compare

    limit = sources_limit(sglang, len(real_kv.sources) if real_kv is not None else 0)
    if limit is not None:
        rec.add("absent", "sglang_cuda", "us_per_call", 0, note=limit, **case)
        return
    ours = _our_side(world, copy.deepcopy(store), real_kv, VERIFY_TAG)
    theirs, bad = _sglang_beside(sglang, ours, world)
    bad += verify_and_compare(ours, theirs, seed=world.bs + 1)
    del ours
    if bad:
        raise AssertionError(f"sglang_cuda differs from this project: {'; '.join(bad)}")
    time_sglang(rec, theirs, theirs.verify, "verify", case, replays)


def sglang_write_case(
    rec: Recorder, sglang, world: World, start: CanaryStore, case: dict, replays: int
) -> None:
    """SGLang's write of the case beside ``launch_write``'s: from ``start`` (a copy of the
    case's store after the fill) and a fresh SGLang store, each side writes the fill from its
    own plan (records byte for byte), plans the step (the plan fields) and writes it (records,
    counters, no violation); then SGLang's write is timed as ``launch_write`` is."""
    from benchmarks.sglang_cuda import write_and_compare

    ours = _our_side(world, start, None, WRITE_TAG)
    theirs, bad = _sglang_beside(sglang, ours, world)
    bad += write_and_compare(ours, theirs, world.step_inputs)
    del ours
    if bad:
        raise AssertionError(f"sglang_cuda differs from this project: {'; '.join(bad)}")
    inputs = world.step_inputs
    time_sglang(rec, theirs, lambda: theirs.write(inputs), "write", case, replays)


def _our_side(world: World, store: CanaryStore, real_kv: RealKV | None, tag: int):
    """This project's side of an SGLang comparison: ``store`` (a copy of the case's, after
    the fill) and plan buffers of its own."""
    from benchmarks.sglang_cuda import OurSide

    buffers = PlanBuffers.allocate(
        write_req_capacity=world.bs, verify_capacity=max(world.entries, 1), device=world.device
    )
    return OurSide(store, buffers, real_kv=real_kv, launch_tag=tag)


def _sglang_beside(sglang, ours, world: World):
    from benchmarks.sglang_cuda import sglang_beside

    return sglang_beside(sglang, ours, world, fill=world.prefix_tokens > 0)


def time_sglang(rec: Recorder, theirs, fn, what: str, case: dict, replays: int) -> None:
    """``gpu_time`` of SGLang's call, recorded as ``sglang_cuda``; no violation after."""
    t = gpu_time(fn, replays)
    rec.add(
        "gpu_time",
        "sglang_cuda",
        "us_per_call",
        t.us,
        replays=t.replays,
        calls_per_graph=t.calls_per_graph,
        **case,
    )
    found = theirs.counters()[0]
    if found:
        raise AssertionError(f"SGLang's {what} appended {found} violations while timed")
    rec.add("check", "sglang_cuda", "violations_after_timing", found, **case)


def record_host(
    rec: Recorder,
    launcher: str,
    validated: HostTime,
    bare: HostTime,
    case: dict,
    bare_name: str = "bare_dispatch",
) -> None:
    rec.add("host", launcher, "us_per_call", validated.median, spread=validated, **case)
    rec.add("host", f"{launcher}:{bare_name}", "us_per_call", bare.median, spread=bare, **case)
    rec.add("host", f"{launcher}:ratio", "ratio", validated.median / bare.median, **case)
    register_target(rec, rec.stage, "host", launcher, HOST_TARGET_US, **case)


def smoke_verify_checks(
    world: World, buffers: PlanBuffers, store: CanaryStore, real_kv: RealKV | None
) -> None:
    """Smoke mode only: the torch-only verify is sync-free (so capturable); on a clean
    store and on a corrupted one, ``launch_verify`` and the torch-only verify append the
    same rows as ``verify_reference`` (the torch one in the same order)."""
    from benchmarks.harness import SyncDetector

    probe = copy.deepcopy(store)
    with SyncDetector() as det:
        TorchVerify(probe, buffers, launch_tag=TORCH_TAG, real_kv=real_kv)()
    if det.syncing:
        raise AssertionError(f"the torch-only verify would sync: {sorted(set(det.syncing))}")

    # Corrupt three records (token, position, chain hash) and, with real KV, one slot's bytes.
    entries = buffers.verify_slot_indices[: world.entries]
    picks = entries[torch.randperm(entries.numel(), generator=torch.Generator().manual_seed(1))[:4]]
    bad = copy.deepcopy(store)
    bad.records[picks[0], 0] += 1
    if picks.numel() > 1:
        bad.records[picks[1], 1] += 7
    if picks.numel() > 2:
        bad.records[picks[2], 2] ^= 0x5A5A
    saved = None
    if real_kv is not None and picks.numel() > 3:
        src = real_kv.tensors[1].view(torch.uint8)
        saved = src[picks[3]].clone()
        src[picks[3], 3] ^= 0xFF
    try:
        stores = [copy.deepcopy(bad) for _ in range(3)]
        verify_reference(stores[0], buffers, launch_tag=TORCH_TAG, real_kv=real_kv)
        launch_verify(stores[1], buffers, launch_tag=TORCH_TAG, real_kv=real_kv)
        TorchVerify(stores[2], buffers, launch_tag=TORCH_TAG, real_kv=real_kv)()
    finally:
        if saved is not None:
            real_kv.tensors[1].view(torch.uint8)[picks[3]] = saved
    found = int(stores[0].violation_count)
    if found < min(3, picks.numel()):
        raise AssertionError(f"the corrupted store gave only {found} violation rows")
    check_violations_equal(stores[0], stores[1], "launch_verify vs verify_reference", False)
    check_violations_equal(stores[0], stores[2], "torch-only vs verify_reference", True)
    print(
        f"smoke: verify bs={world.bs} swa={world.window} "
        f"{'NONE' if real_kv is None else real_kv.mode.name}: {found} violation rows of a "
        "corrupted store agree across launch_verify, torch-only and the reference; "
        f"torch-only ran {len(det.ops)} aten ops, none syncing",
        flush=True,
    )


# --- write ---------------------------------------------------------------------------------
def bench_write(
    rec: Recorder,
    sizes: Sizes,
    replays: int,
    host_calls: int,
    bandwidth: float,
    reference_repeats: int,
    sglang=None,
) -> None:
    """``sglang``: SGLang's ops (``benchmarks.sglang_cuda.SglangOps``) for the
    ``sglang_cuda`` column, or None."""
    rec.stage = "write"
    for wc in sizes.write:
        guarded(
            rec,
            f"write {wc.kind} {wc.rows}x{wc.tokens}",
            lambda: write_case(
                rec, wc, sizes, replays, host_calls, bandwidth, reference_repeats, sglang
            ),
        )
        _free()


def write_case(
    rec: Recorder,
    wc: WriteCase,
    sizes: Sizes,
    replays: int,
    host_calls: int,
    bandwidth: float,
    reference_repeats: int,
    sglang=None,
) -> None:
    world = World(wc.rows, wc.prefix, wc.tokens, 0, ENV.device, seed=wc.rows * 7 + wc.tokens)
    case = dict(
        case=f"{wc.kind} {wc.rows}x{wc.tokens}",
        bs=wc.rows,
        swa=0,
        pool=1,
        entries=world.entries,
        real_kv="NONE",
        tokens=world.n,
    )
    store = world.new_store(None, check_fill=ENV.smoke)
    store.enable_chain_position_check()
    buffers = world.plan()
    inputs = world.step_inputs
    before_write = copy.deepcopy(store)
    if sglang is not None:
        start = copy.deepcopy(store)
        guarded(
            rec,
            f"write sglang_cuda {case['case']}",
            lambda: sglang_write_case(rec, sglang, world, start, case, replays),
        )
        del start

    def write() -> None:
        launch_write(store, buffers, launch_tag=WRITE_TAG, **inputs)

    def timed_kernel() -> None:
        before = int(store.slots_processed)
        write()
        expect_clean(store, "one launch_write")
        if int(store.slots_processed) - before != world.n:
            raise AssertionError(
                f"launch_write wrote {int(store.slots_processed) - before} "
                f"records, expected {world.n}"
            )
        t = gpu_time(write, replays)
        rec.add(
            "gpu_time",
            "launch_write",
            "us_per_call",
            t.us,
            replays=t.replays,
            calls_per_graph=t.calls_per_graph,
            **case,
        )
        rec.add(
            "check",
            "launch_write",
            "violations_after_timing",
            expect_clean(store, "timing launch_write"),
            **case,
        )

    guarded(rec, f"write launch_write {case['case']}", timed_kernel)

    def reference() -> None:
        ref = before_write

        def call() -> None:
            write_reference(ref, buffers, launch_tag=WRITE_TAG, **inputs)

        if ENV.smoke:
            from benchmarks.harness import SyncDetector

            with SyncDetector() as det:  # the reason it is timed eagerly
                call()
            print(
                f"smoke: write_reference syncs ({len(det.syncing)} syncing ops, e.g. "
                f"{sorted(set(det.syncing))[:3]}): timed eagerly",
                flush=True,
            )
        t = eager_wall_us(call, reference_repeats)
        rec.add(
            "gpu_time",
            "write_reference_eager",
            "us_per_call_wall",
            t.us,
            replays=t.replays,
            note="eager wall time with torch.cuda.synchronize",
            **case,
        )
        expect_clean(ref, "write_reference")
        if not torch.equal(ref.records, store.records):
            raise AssertionError("launch_write's records differ from write_reference's")

    guarded(rec, f"write write_reference {case['case']}", reference)

    def traffic() -> None:
        out_records = torch.zeros_like(store.records)
        sink = torch.zeros(
            write_traffic_grid(world.n, world.bs)[1], dtype=torch.int64, device=ENV.device
        )

        def run() -> None:
            write_traffic(store, buffers, world.bs, out_records, sink, **inputs)

        run()
        tok_programs = write_traffic_grid(world.n, world.bs)[0]
        got = out_records.index_select(0, inputs["out_cache_loc"])
        ids, pos = inputs["input_ids"], inputs["positions"]
        want = torch.stack([ids, pos, ids ^ pos, torch.zeros_like(ids)], dim=1)
        if not torch.equal(got, want) or not torch.equal(
            sink[tok_programs:].sum(), write_traffic_expected(store, buffers, world.bs)
        ):
            raise AssertionError("traffic_only: the kernel's records or sums differ from torch's")
        t = gpu_time(run, replays)
        rec.add(
            "gpu_time",
            "traffic_only",
            "us_per_call",
            t.us,
            replays=t.replays,
            calls_per_graph=t.calls_per_graph,
            **case,
        )

    guarded(rec, f"write traffic_only {case['case']}", traffic)
    rec.add(
        "gpu_time",
        "bandwidth_floor",
        "us_per_call",
        write_bytes(world.n, world.bs, world.seeded_rows) / bandwidth * 1e6,
        **case,
    )
    register_target(rec, "write", "gpu_time", "launch_write", wc.target_us, **case)

    def host() -> None:
        args = validate_write_args(store, buffers, launch_tag=WRITE_TAG, **inputs)
        gpu_us = value_of(
            rec.rows, stage="write", section="gpu_time", impl="launch_write", case=case["case"]
        )
        times = host_time_stats_us(
            {"launch_write": write, "bare_dispatch": lambda: dispatch_write(store, buffers, args)},
            host_calls_for(gpu_us, host_calls),
        )
        record_host(rec, "launch_write", times["launch_write"], times["bare_dispatch"], case)
        allocations = count_allocations(write)
        if allocations is not None:
            rec.add("alloc", "launch_write", "allocations_per_100", allocations, **case)
        expect_clean(store, "the host timing of launch_write")

    guarded(rec, f"write host {case['case']}", host)


# --- step ----------------------------------------------------------------------------------
def bench_step(rec: Recorder, sizes: Sizes, replays: int, host_calls: int) -> None:
    rec.stage = "step"
    for bs in sizes.step:
        for window in (0, sizes.window):
            guarded(
                rec,
                f"step bs={bs} swa={window}",
                lambda: step_case(rec, bs, window, sizes, replays, host_calls),
            )
            _free()


def step_case(
    rec: Recorder, bs: int, window: int, sizes: Sizes, replays: int, host_calls: int
) -> None:
    world = World(bs, sizes.prefix, 1, window, ENV.device, seed=bs + window + 11)
    case = dict(
        case=f"bs={bs} swa={window}",
        bs=bs,
        swa=window,
        pool=1,
        entries=world.entries,
        real_kv="NONE",
        tokens=world.n,
    )
    store = world.new_store(None)
    store.enable_chain_position_check()
    buffers = world.plan()
    plan_kwargs, inputs = world.plan_kwargs, world.step_inputs

    def plan() -> None:
        launch_plan(buffers, **plan_kwargs)

    def verify() -> None:
        launch_verify(store, buffers, launch_tag=VERIFY_TAG)

    def write() -> None:
        launch_write(store, buffers, launch_tag=WRITE_TAG, **inputs)

    def step() -> None:
        plan()
        verify()
        write()

    pargs = validate_plan_args(buffers, **plan_kwargs)
    vargs = validate_verify_args(store, buffers, launch_tag=VERIFY_TAG)
    wargs = validate_write_args(store, buffers, launch_tag=WRITE_TAG, **inputs)

    def bare_plan() -> None:
        dispatch_plan(buffers, pargs)

    def bare_verify() -> None:
        dispatch_verify(store, buffers, vargs)

    def bare_write() -> None:
        dispatch_write(store, buffers, wargs)

    def bare_step() -> None:
        bare_plan()
        bare_verify()
        bare_write()

    step()
    expect_clean(store, "one eager step")

    timing: list[float] = []

    def timed() -> None:
        t = gpu_time(step, replays)
        timing.append(t.us)
        rec.add(
            "gpu_time",
            "step",
            "us_per_call",
            t.us,
            replays=t.replays,
            calls_per_graph=t.calls_per_graph,
            note="launch_plan + launch_verify + launch_write",
            **case,
        )
        rec.add(
            "check",
            "step",
            "violations_after_timing",
            expect_clean(store, "timing the step"),
            **case,
        )

    guarded(rec, f"step graph {case['case']}", timed)
    times = host_time_stats_us(
        {
            "launch_plan": plan,
            "launch_plan:bare": bare_plan,
            "launch_verify": verify,
            "launch_verify:bare": bare_verify,
            "launch_write": write,
            "launch_write:bare": bare_write,
            "step": step,
            "step:bare": bare_step,
        },
        host_calls_for(timing[0] if timing and on_gpu() else None, host_calls),
    )
    for launcher in ("launch_plan", "launch_verify", "launch_write"):
        record_host(rec, launcher, times[launcher], times[f"{launcher}:bare"], case)
    step_t, bare_t = times["step"], times["step:bare"]
    rec.add(
        "host",
        "step",
        "us_per_call",
        step_t.median,
        spread=step_t,
        note="eager plan + verify + write",
        **case,
    )
    rec.add("host", "step:bare_dispatch", "us_per_call", bare_t.median, spread=bare_t, **case)
    rec.add("host", "step:ratio", "ratio", step_t.median / bare_t.median, **case)
    expect_clean(store, "the host timing of the step")

    allocations = count_allocations(step)
    if allocations is not None:
        rec.add(
            "alloc",
            "step",
            "allocations_per_100",
            allocations,
            note="100 eager steps (plan + verify + write) after warm-up",
            **case,
        )
    # Issue 28: 0 device allocations over 100 steps (absent off CUDA: the summary says n/a).
    rec.add("target", "step", "max_allocations_per_100", 0, stage="step", note="alloc", **case)
    expect_clean(store, "100 steps")


# --- sources: the cost of covering every layer --------------------------------------------
class SourcesSizes(NamedTuple):
    bs: int
    prefix: tuple[int, int]
    layers: int
    """Layers of the pool: two sources (K and V) each."""
    counts: tuple[int, ...]
    """Sources per ``RealKV``: the first ``count`` views, layer 0's K and V first."""
    bytes_per_token: int
    """Bytes of a slot in a source (mode ALL reads them all)."""


GPU_SOURCES = SourcesSizes(
    bs=4096, prefix=(1, 1023), layers=128, counts=(1, 2, 8, 32, 128, 256), bytes_per_token=64
)
"""Issue 26 section 3: a decode step at 4096 rows, up to every layer's K and V of a
128-layer model. The pool: 128 x 2 x 4.2M slots x 64 bytes = 69 GB, which an H200 holds
beside the rest (a real layer's 1-2 KB a token would not fit 256 times: PARTIAL reads 16
bytes of a slot and source whatever its width; ALL reads the 64)."""

SMOKE_SOURCES = SourcesSizes(bs=5, prefix=(1, 11), layers=3, counts=(1, 5), bytes_per_token=32)
"""Tiny, for the interpreter: one source, and more than one group of four (PARTIAL)."""


def sources_pool(world: World, sizes: SourcesSizes, seed: int) -> list[torch.Tensor]:
    """``2 * layers`` views of one bf16 pool ``[layers, 2, num_slots, bytes_per_token]`` of
    random bytes: each a layer's K or V as 2-D ``[num_slots, bytes of a slot]``."""
    torch.manual_seed(seed)
    words = sizes.bytes_per_token // 8
    pool = torch.empty(
        (sizes.layers, 2, world.num_slots, words), dtype=torch.int64, device=world.device
    )
    pool.random_()
    kv = pool.view(torch.bfloat16)
    return [kv[layer, half] for layer in range(sizes.layers) for half in range(2)]


def bench_sources(rec: Recorder, sizes: SourcesSizes, replays: int, host_calls: int) -> None:
    """Verify and write of one decode step against the number of real-KV sources (see the
    module docstring); each case checked clean (no violation, no status bit, every entry
    looked at, every token written) before and after its timing."""
    rec.stage = "sources"
    world = World(sizes.bs, sizes.prefix, 1, 0, ENV.device, seed=sizes.bs + 26)
    buffers = world.plan()
    views = sources_pool(world, sizes, seed=26)
    for mode in ("PARTIAL", "ALL"):
        for count in sizes.counts:
            guarded(
                rec,
                f"sources {mode} {count}",
                lambda: sources_case(
                    rec, world, buffers, views, mode, count, sizes, replays, host_calls
                ),
            )
            _free()


def sources_case(
    rec: Recorder,
    world: World,
    buffers: PlanBuffers,
    views: list[torch.Tensor],
    mode: str,
    count: int,
    sizes: SourcesSizes,
    replays: int,
    host_calls: int,
) -> None:
    real_kv = RealKV(
        mode=RealKVMode[mode],
        sources=[
            RealKVSource(v, page_size=1, bytes_per_token=sizes.bytes_per_token)
            for v in views[:count]
        ],
    )
    case = dict(
        case=f"bs={world.bs} {mode} sources={count}",
        bs=world.bs,
        swa=0,
        pool=1,
        entries=world.entries,
        real_kv=mode,
        tokens=world.n,
        note=f"sources={count}",
    )
    store = world.new_store(real_kv, check_fill=ENV.smoke)
    store.enable_chain_position_check()
    inputs = world.step_inputs

    def verify() -> None:
        launch_verify(store, buffers, launch_tag=VERIFY_TAG, real_kv=real_kv)

    def write() -> None:
        launch_write(store, buffers, launch_tag=WRITE_TAG, real_kv=real_kv, **inputs)

    for name, fn, counter, want in (
        ("launch_verify", verify, "entries looked at", world.entries),
        ("launch_write", write, "records written", world.n),
    ):
        before = int(store.slots_processed)
        fn()
        expect_clean(store, f"one {name}")
        if int(store.slots_processed) - before != want:
            raise AssertionError(
                f"{name}: {int(store.slots_processed) - before} {counter}, expected {want}"
            )
        t = gpu_time(fn, replays)
        rec.add(
            "gpu_time",
            name,
            "us_per_call",
            t.us,
            replays=t.replays,
            calls_per_graph=t.calls_per_graph,
            **case,
        )
        rec.add(
            "check", name, "violations_after_timing", expect_clean(store, f"timing {name}"), **case
        )
    if ENV.smoke:
        ref = copy.deepcopy(store)
        write_reference(ref, buffers, launch_tag=WRITE_TAG, real_kv=real_kv, **inputs)
        verify_reference(ref, buffers, launch_tag=VERIFY_TAG, real_kv=real_kv)
        expect_clean(ref, "the references")
        if not torch.equal(ref.records, store.records):
            raise AssertionError("launch_write's records differ from write_reference's")
    vargs = validate_verify_args(store, buffers, launch_tag=VERIFY_TAG, real_kv=real_kv)
    wargs = validate_write_args(store, buffers, launch_tag=WRITE_TAG, real_kv=real_kv, **inputs)
    gpu_us = value_of(
        rec.rows, stage="sources", section="gpu_time", impl="launch_verify", case=case["case"]
    )
    times = host_time_stats_us(
        {
            "launch_verify": verify,
            "launch_verify:bare": lambda: dispatch_verify(store, buffers, vargs),
            "launch_write": write,
            "launch_write:bare": lambda: dispatch_write(store, buffers, wargs),
        },
        host_calls_for(gpu_us, host_calls),
    )
    for launcher in ("launch_verify", "launch_write"):
        validated, bare = times[launcher], times[f"{launcher}:bare"]
        rec.add("host", launcher, "us_per_call", validated.median, spread=validated, **case)
        rec.add(
            "host", f"{launcher}:bare_dispatch", "us_per_call", bare.median, spread=bare, **case
        )
    expect_clean(store, "the host timing")


def _free() -> None:
    if ENV.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
