"""GPU-only tests of the launchers' host fast path (skipped without CUDA): after the first
launch for a (store, plan buffers, sources, config) combination, later launches hand the
compiled kernel cached addresses (kv_canary_kernels/fast_launch.py). Repeated launches with
changing inputs, tags and sources must equal the references; the fast path must actually
be taken; an object tampered with after caching must still be refused with nothing
written; a config change must launch its own variant."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch

from kv_canary_buffers import (
    CanaryStore,
    PlanBuffers,
    RealKV,
    RealKVMode,
    plan_reference,
    plans_equal,
    verify_reference,
    write_reference,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from kv_canary_kernels import verify as verify_module
from kv_canary_kernels import write as write_module
from kv_canary_kernels.config import launch_config
from kv_canary_kernels.fast_launch import Launcher
from kv_canary_kernels.plan import dispatch as plan_module

pytestmark = pytest.mark.gpu
DEV = "cuda"
POISON = -5555
COLS = 64


def rows_multiset(store: CanaryStore) -> Counter:
    n = min(int(store.violation_count), store.violation_capacity)
    return Counter(map(tuple, store.violations[:n].tolist()))


def assert_same(out: CanaryStore, ref: CanaryStore, what: str) -> None:
    assert torch.equal(out.records, ref.records), what
    for name in ("violation_count", "kernel_runs", "slots_processed", "status"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), f"{what}: {name}"
    assert rows_multiset(out) == rows_multiset(ref), what


def batch(g: torch.Generator, bs: int, rows: int, *, pool: bool = True, window: int = 0) -> dict:
    """A batch of ``bs`` rows of a ``rows`` x COLS table; the token pool or not, a
    sliding window with its LUT or not."""
    table = (torch.randperm(rows * COLS, generator=g) + 1).reshape(rows, COLS).to(torch.int32)
    prefix = torch.randint(0, COLS - 8, (bs,), generator=g)
    out = dict(
        req_pool_indices=(torch.randperm(rows - 1, generator=g)[:bs] + 1).to(DEV),
        prefix_lens=prefix.to(DEV),
        extend_seq_lens=torch.randint(0, 4, (bs,), generator=g).to(DEV),
        req_to_token=table.to(DEV),
    )
    if pool:
        out["req_to_verify_expected_tokens"] = torch.randint(
            0, 9, (rows, COLS), generator=g, dtype=torch.int32
        ).to(DEV)
        out["req_to_verify_expected_tokens_valid_lens"] = prefix.to(DEV)
    if window:
        out["swa_window_size"] = window
        out["full_to_swa_index_mapping"] = torch.randperm(rows * COLS + 1, generator=g).to(DEV)
    return out


def unaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a tensor whose address is 8 bytes past a 16-byte boundary."""
    room = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = room[1:] if room.data_ptr() % 16 == 0 else room[:-1]
    out.copy_(t)
    assert out.data_ptr() % 16 == 8
    return out


def sources(g: torch.Generator, num_slots: int) -> RealKV:
    kv = [torch.randint(-9, 9, (num_slots, 32), generator=g).to(torch.bfloat16).to(DEV)]
    kv.append(torch.randint(-9, 9, (num_slots, 32), generator=g).to(torch.bfloat16).to(DEV))
    return RealKV(mode=RealKVMode.PARTIAL, sources=tuple(kv), page_size=1, bytes_per_token=64)


def test_repeated_steps_equal_the_references_through_the_fast_path(monkeypatch):
    """Steps of changing batches (both plan paths; with and without the token pool, a
    sliding window), tags, real-KV sources and write inputs (aligned or not), on one store
    and one plan buffers: every launch after the first of its kind takes the fast path."""
    monkeypatch.setattr(verify_module, "_FAST", type(verify_module._FAST)())
    monkeypatch.setattr(write_module, "_FAST", type(write_module._FAST)())
    g = torch.Generator().manual_seed(7)
    rows = 1600
    num_slots = rows * COLS + 1
    plan = PlanBuffers.allocate(write_req_capacity=1500, verify_capacity=1500 * COLS, device=DEV)
    ref_plan = PlanBuffers.allocate(
        write_req_capacity=1500, verify_capacity=1500 * COLS, device=DEV
    )
    out, ref = [
        CanaryStore.allocate(num_slots=num_slots, violation_capacity=1 << 16, device=DEV)
        for _ in range(2)
    ]
    # records of random content: verify reports rows, each carrying its call's tag
    base = torch.randint(-3, 3, (num_slots, 4), generator=g).to(DEV)
    for s in (out, ref):
        s.records.copy_(base)
        s.violations.fill_(POISON)
        s.enable_chain_position_check()
    kvs = [None, sources(g, num_slots), sources(g, num_slots)]
    slow = Counter()
    for name, launcher in (("verify", verify_module._VERIFY), ("write", write_module._WRITE)):
        real = launcher.launch

        def counted(*args, _real=real, _name=name, **kwargs):
            slow[_name] += 1
            return _real(*args, **kwargs)

        # (in the instance's dict: undone by deleting the key, where setattr's undo would
        # leave the bound method there, shadowing a later test's patch of the class)
        monkeypatch.setitem(launcher.__dict__, "launch", counted)
    sizes = [5, 300, 300, 1100, 1500, 300, 5, 1100, 64, 1500, 300, 700]
    for step, bs in enumerate(sizes):
        b = batch(g, bs, rows, pool=step % 4 != 1, window=16 if step % 5 == 2 else 0)
        plan.verify_slot_indices.fill_(POISON)
        launch_plan(plan, **b)
        plan_reference(ref_plan, **b)
        assert plans_equal(plan, ref_plan, bs), f"step {step}: plan of {bs} rows"
        kv = kvs[step % 3]
        launch_verify(out, plan, launch_tag=10 + step, real_kv=kv)
        verify_reference(ref, ref_plan, launch_tag=10 + step, real_kv=kv)
        assert_same(out, ref, f"step {step}: verify")
        n = int(plan.write_offsets[bs])
        loc = torch.randperm(num_slots - 1, generator=g)[:n] + 1
        inputs = dict(
            input_ids=torch.randint(0, 9, (n,), generator=g).to(DEV),
            positions=torch.randint(0, 70, (n,), generator=g).to(DEV),
            out_cache_loc=loc.to(DEV),
        )
        if step % 3 == 2:  # an unaligned input: another compiled variant, its own entry
            inputs["positions"] = unaligned(inputs["positions"])
        launch_write(out, plan, launch_tag=100 + step, real_kv=kv, **inputs)
        write_reference(ref, ref_plan, launch_tag=100 + step, real_kv=kv, **inputs)
        assert_same(out, ref, f"step {step}: write")
        assert int(ref.violation_count) > 0
        out.take_violations()
        ref.take_violations()
    # Per sources (None, two RealKVs sharing a compiled variant): at most a compiling
    # call and a caching call go through the launcher, the others take the fast path.
    # (The write's alignment differs between steps: each case caches once.)
    assert slow["verify"] <= 5, slow
    assert slow["write"] <= 9, slow


def test_the_fast_path_skips_the_launcher_once_cached(monkeypatch):
    store = CanaryStore.allocate(num_slots=4096, violation_capacity=64, device=DEV)
    plan = PlanBuffers.allocate(write_req_capacity=16, verify_capacity=1024, device=DEV)
    g = torch.Generator().manual_seed(1)
    b = batch(g, 16, 60)
    n = int(b["extend_seq_lens"].sum())
    inputs = dict(
        input_ids=torch.arange(n, device=DEV),
        positions=torch.arange(n, device=DEV),
        out_cache_loc=torch.arange(1, n + 1, device=DEV),
    )
    for _ in range(2):  # compile, then cache
        launch_plan(plan, **b)
        launch_verify(store, plan, launch_tag=1)
        launch_write(store, plan, launch_tag=2, **inputs)
    torch.cuda.synchronize()
    runs = int(store.kernel_runs[0])

    def refuse(*args, **kwargs):
        raise AssertionError("the fast path went through Launcher.launch")

    monkeypatch.setattr(Launcher, "launch", refuse)
    launch_plan(plan, **b)
    launch_verify(store, plan, launch_tag=1)
    launch_write(store, plan, launch_tag=2, **inputs)
    torch.cuda.synchronize()
    assert int(store.kernel_runs[0]) == runs + 2
    assert plan_module._SMALL.fixed and verify_module._FAST and write_module._FAST


def test_after_caching_a_read_field_changed_in_place_is_harmless_and_a_freed_arena_refused():
    """A cached launch passes the addresses the store's check proves: a tensor read from a
    field and re-pointed (``.data =``) changes that alias only, so the launch still writes
    the store's own memory; the store's storage freed through an alias is refused."""
    store = CanaryStore.allocate(num_slots=256, violation_capacity=64, device=DEV)
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=64, device=DEV)
    for _ in range(2):
        launch_verify(store, plan)
    torch.cuda.synchronize()
    runs = int(store.kernel_runs[0])
    alias = store.records
    alias.data = torch.zeros(1, dtype=torch.int64, device=DEV)
    launch_verify(store, plan)
    torch.cuda.synchronize()
    assert int(store.kernel_runs[0]) == runs + 1
    assert store.records.shape == (256, 4)
    store.records.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match=r"kv-canary: its arena's storage is no longer"):
        launch_verify(store, plan)


def test_two_stores_and_a_config_change_each_launch_their_own():
    """Two stores of different sizes alternate on one plan, then a config change: each
    launch equals its reference (a cached launch of the other store or config would not)."""
    g = torch.Generator().manual_seed(3)
    rows = 40
    plan = PlanBuffers.allocate(write_req_capacity=32, verify_capacity=32 * COLS, device=DEV)
    b = batch(g, 32, rows)
    plan_reference(plan, **b)
    stores = []
    for num_slots in (rows * COLS + 1, rows * COLS + 77):
        base = torch.randint(-3, 3, (num_slots, 4), generator=g).to(DEV)
        pair = [
            CanaryStore.allocate(num_slots=num_slots, violation_capacity=4096, device=DEV)
            for _ in range(2)
        ]
        for s in pair:
            s.records.copy_(base)
        stores.append(pair)
    for tag in range(6):
        out, ref = stores[tag % 2]
        with launch_config(verify_block=64) if tag >= 4 else contextlib.nullcontext():
            launch_verify(out, plan, launch_tag=tag)
        verify_reference(ref, plan, launch_tag=tag)
        assert_same(out, ref, f"call {tag}")
        out.take_violations()
        ref.take_violations()
