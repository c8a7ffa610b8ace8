"""What the write and verify stages share in torch: the store-and-plan checks at their
door, the chain hash of a record, the ring's append and the references' errors.

The record and ring formats themselves are the layout's (:mod:`.layout`, ``RECORDS`` and
``VIOLATION_COLUMNS``; docs/contract-canary.md).
"""

from __future__ import annotations

from typing import NoReturn

import torch

from .buffers import PlanBuffers
from .hashing import H0_SIGNED, mix3
from .real_kv import RealKV, first_uncovered_source
from .store import CanaryStore


# --- the door: a store and a plan ----------------------------------------------------------
def check_store(store: object) -> CanaryStore:
    """Accept only the library's own :class:`CanaryStore` (exact type), re-checked."""
    if type(store) is not CanaryStore:
        raise TypeError(
            "kv-canary: store must be a kv_canary_buffers.CanaryStore (build one with "
            f"CanaryStore.allocate), got {type(store).__name__}"
        )
    store.check()
    return store


def check_plan_buffers(buffers: object) -> PlanBuffers:
    """Accept only the library's own :class:`PlanBuffers` (exact type), re-checked."""
    if type(buffers) is not PlanBuffers:
        raise TypeError(
            "kv-canary: plan_buffers must be a kv_canary_buffers.PlanBuffers (build one with "
            f"PlanBuffers.allocate), got {type(buffers).__name__}"
        )
    buffers.check()
    return buffers


def check_not_aliasing_store(name: str, t: torch.Tensor, store: CanaryStore) -> None:
    if store.arena.overlaps(t):
        raise ValueError(
            f"kv-canary: {name} must not share memory with the CanaryStore it writes, got a "
            "tensor inside the store's arena (pass the engine's own tensors)"
        )


def check_real_kv(real_kv: object, store: CanaryStore) -> RealKV | None:
    """Accept only the library's own :class:`RealKV` (exact type), re-checked, on the
    store's device, outside its arena, every source covering its slots; None for one that
    hashes nothing."""
    if real_kv is None:
        return None
    if type(real_kv) is not RealKV:
        raise TypeError(
            "kv-canary: real_kv must be a kv_canary_buffers.RealKV or None, "
            f"got {type(real_kv).__name__}"
        )
    real_kv.check()
    if real_kv.hashed_bytes == 0:
        return None
    arena = store.arena
    if not arena.on_device(real_kv._tensors[0]):  # real_kv.device != store's
        raise ValueError(
            f"kv-canary: real_kv sources must be on the store's device {store.device}, "
            f"got {real_kv.device}"
        )
    # The sources' byte spans (merged: one range per KV allocation, however many sources
    # are views of it) were computed at construction: check() just proved each source
    # still has the address, shape, strides and dtype they were computed from.
    start = arena.base
    end = start + arena.nbytes
    for lo, hi in real_kv._spans:
        if lo < end and start < hi:
            for i, src in enumerate(real_kv._tensors):
                check_not_aliasing_store(f"real_kv.sources[{i}]", src, store)
    if real_kv._covers < store.num_slots:
        _raise_uncovered(real_kv, store.num_slots)
    return real_kv


def _raise_uncovered(real_kv: RealKV, num_slots: int) -> NoReturn:
    i = first_uncovered_source(real_kv, num_slots)
    assert i is not None, "kv-canary: internal error: the coverage check failed alone"
    src = real_kv._sources[i]
    raise ValueError(
        f"kv-canary: real_kv.sources[{i}] must cover the store's num_slots = {num_slots} "
        f"slots (rows * page_size >= num_slots), got {src.rows} rows x page_size "
        f"{src.page_size} = {src.rows * src.page_size} slots (a RealKV not rebuilt after the "
        "pool grew, a wrong page_size, or a view of part of a layer)"
    )


def check_same_device(store: CanaryStore, buffers: PlanBuffers) -> None:
    if store.device != buffers.device:
        raise ValueError(
            f"kv-canary: plan_buffers must be on the store's device {store.device}, "
            f"got {buffers.device}"
        )


# --- records and the ring (the references) ---------------------------------------------
def chain_hash_of(records: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The contract's ``hash_of(s)``: ``mix3(prev_hash, token, position)`` of each slot's
    record, ``H0`` for a negative slot. ``slots`` int64 ``[m]``, each ``< num_slots``."""
    rec = records.index_select(0, slots.clamp_min(0))
    hashed = mix3(rec[:, 2], rec[:, 0], rec[:, 1])
    return torch.where(slots < 0, H0_SIGNED, hashed)


def raise_bad(argument: str, index: int, value: int, rule: str) -> None:
    """The references' error for data the kernels would skip with a status bit."""
    raise ValueError(
        f"kv-canary: {argument}[{index}] = {value} must be {rule} (data outside the store "
        "or the inputs: the kernels skip it and raise a CanaryStatus bit)"
    )


def plan_count(buffers: PlanBuffers, name: str, capacity: int) -> int:
    """A plan counter, refused when outside ``[0, capacity]`` (never written by a plan)."""
    value = int(getattr(buffers, name).item())
    if not 0 <= value <= capacity:
        raise_bad(f"plan_buffers.{name}", 0, value, f"in [0, {capacity}]")
    return value


def append_rows(store: CanaryStore, rows: torch.Tensor, context: torch.Tensor) -> None:
    """Append int64 ``[m, 8]`` rows to the ring in order, each with its int64 ``[m, 3]``
    context row at the same index: fill once, count everything."""
    count = int(store.violation_count.item())
    capacity = store.violation_capacity
    keep = max(0, min(rows.shape[0], capacity - count))
    if keep:
        store.violations[count : count + keep].copy_(rows[:keep])
        store.violation_context[count : count + keep].copy_(context[:keep])
    store.violation_count.add_(rows.shape[0])


def request_of_entries(buffers: PlanBuffers, entries: torch.Tensor) -> torch.Tensor:
    """The contract's ``request_of(i)`` of each verify entry index in ``entries`` (int64
    ``[m]``): the bisection over ``verify_offsets[0 .. bs)`` (``bs`` the write row count,
    clamped into ``[0, write_req_capacity]``), step for step as the verify kernel runs it,
    so that both paths agree on any bytes; ``0`` where ``bs == 0``."""
    capacity = buffers.write_req_capacity
    bs = min(max(int(buffers.write_num_valid_reqs.item()), 0), capacity)
    if bs == 0 or entries.numel() == 0:
        return torch.zeros_like(entries)
    offsets = buffers.verify_offsets
    lo = torch.zeros_like(entries)
    hi = torch.full_like(entries, bs)
    for _ in range(bs.bit_length()):  # each round halves hi - lo, from bs
        active = hi - lo > 1
        mid = torch.where(active, (lo + hi) // 2, lo)
        right = offsets.index_select(0, mid) <= entries
        lo = torch.where(active & right, mid, lo)
        hi = torch.where(active & ~right, mid, hi)
    return buffers.row_req_pool_indices.index_select(0, lo)
