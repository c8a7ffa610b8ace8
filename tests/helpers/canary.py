"""Helpers of the write/verify tests: the two canary paths, store poisoning and
snapshots, plans filled by hand, real-KV sources, and a plain-Python loop model of the
contract (docs: canary-contract.md), written independently of the library.

The model states the contract's sequential semantics and, for data out of range, what the
kernels do (skip the entry, raise a :class:`CanaryStatus` bit): it is the oracle of the
out-of-range tests, and the property tests check it against the torch reference on valid
data.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from kv_canary_buffers import (
    CanaryStatus,
    CanaryStore,
    FailBits,
    PlanBuffers,
    RealKV,
    RealKVMode,
    verify_reference,
    write_reference,
)
from kv_canary_buffers.hashing import H0_SIGNED, mix3_int, sm_int, to_signed
from kv_canary_buffers.layout import PLAN_FIELDS, store_specs
from kv_canary_kernels import launch_verify, launch_write

I64 = torch.int64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
JUNK = -7777
"""Poison of violation rows and plan outputs: an element nobody should write shows."""

STORE_FIELDS = tuple(name for name, _dtype, _shape in store_specs(1, 1))


class Canary(NamedTuple):
    """One path of the write and verify stages."""

    name: str
    write: Any
    verify: Any


CANARY_PATHS = {
    "reference": Canary("reference", write_reference, verify_reference),
    "kernels": Canary("kernels", launch_write, launch_verify),
}


def i64(values, device=DEVICE) -> torch.Tensor:
    return torch.tensor(values, dtype=I64, device=device)


# --- stores ---------------------------------------------------------------------------
def new_store(num_slots=32, violation_capacity=16, device=DEVICE, *, junk_records=True):
    """A store whose ring holds junk rows (count 0) and whose records hold a distinct
    junk pattern, so that a row or record nobody should write shows."""
    store = CanaryStore.allocate(
        num_slots=num_slots, violation_capacity=violation_capacity, device=device
    )
    store.violations.fill_(JUNK)
    if junk_records:
        s = torch.arange(num_slots, dtype=I64, device=device)[:, None]
        store.records.copy_(s * 1000 + torch.tensor([1, 2, 3, 4], device=device) + 10**6)
    return store


def snapshot_store(store: CanaryStore) -> dict[str, torch.Tensor]:
    return {name: getattr(store, name).clone() for name in STORE_FIELDS}


def assert_store_equal(store: CanaryStore, before: dict[str, torch.Tensor]) -> None:
    for name, old in before.items():
        assert torch.equal(getattr(store, name), old), f"CanaryStore.{name} was written"


def snapshot_plan(buffers: PlanBuffers) -> dict[str, torch.Tensor]:
    return {name: getattr(buffers, name).clone() for name, *_ in PLAN_FIELDS}


def assert_plan_equal(buffers: PlanBuffers, before: dict[str, torch.Tensor]) -> None:
    for name, old in before.items():
        assert torch.equal(getattr(buffers, name), old), f"PlanBuffers.{name} was written"


def counters(store: CanaryStore) -> tuple[int, int, int, int]:
    """(violation_count, kernel_runs, slots_processed, status)."""
    return (
        int(store.violation_count),
        int(store.kernel_runs),
        int(store.slots_processed),
        int(store.status),
    )


def kept_rows(
    store: CanaryStore, start: int = 0, *, context: bool = False
) -> list[tuple[int, ...]]:
    """The ring rows ``[start, min(count, capacity))`` as tuples, in ring order; with
    ``context``, each followed by its three ``violation_context`` columns."""
    end = min(int(store.violation_count), store.violation_capacity)
    rows = store.violations[start:end].tolist()
    if not context:
        return [tuple(r) for r in rows]
    ctx = store.violation_context[start:end].tolist()
    return [tuple(r) + tuple(c) for r, c in zip(rows, ctx)]


def multiset(rows: Sequence[Sequence[int]]) -> collections.Counter:
    return collections.Counter(tuple(int(v) for v in r) for r in rows)


def is_sub_multiset(small, big) -> bool:
    small, big = multiset(small), multiset(big)
    return all(big[k] >= v for k, v in small.items())


def record(store: CanaryStore, slot: int) -> list[int]:
    return store.records[slot].tolist()


def hash_of(rec: Sequence[int]) -> int:
    """The contract's hash_of of one record (token, position, prev_hash, ...)."""
    return mix3_int(rec[2], rec[0], rec[1])


# --- plans filled by hand -----------------------------------------------------------------
def new_plan(write_req_capacity=4, verify_capacity=16, device=DEVICE) -> PlanBuffers:
    """Plan buffers whose outputs hold junk (an element read past a count shows)."""
    buffers = PlanBuffers.allocate(
        write_req_capacity=write_req_capacity, verify_capacity=verify_capacity, device=device
    )
    for field in PLAN_FIELDS:
        if field.role == "output":
            getattr(buffers, field.name).fill_(JUNK)
    return buffers


def set_write_plan(buffers: PlanBuffers, offsets, seeds, num_rows=None, reqs=None) -> None:
    """Write plan of ``len(seeds)`` rows (``offsets`` has one more element), row ``r``'s
    request ``reqs[r]`` (default ``r + 1``); rows past them keep their junk (a path that
    reads them shows)."""
    rows = len(seeds) if num_rows is None else num_rows
    reqs = [r + 1 for r in range(len(seeds))] if reqs is None else reqs
    buffers.write_offsets[: len(offsets)] = i64(offsets)
    buffers.write_seed_slot_indices[: len(seeds)] = i64(seeds)
    buffers.row_req_pool_indices[: len(reqs)] = i64(reqs)
    buffers.write_num_valid_reqs.fill_(rows)


def set_verify_rows(buffers: PlanBuffers, reqs, counts) -> None:
    """The rows the verify names a failing entry by: row ``r`` has request ``reqs[r]``
    and the next ``counts[r]`` verify entries (``verify_offsets`` their exclusive prefix
    sum); ``write_num_valid_reqs = len(reqs)``."""
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    buffers.verify_offsets[: len(offsets)] = i64(offsets)
    buffers.row_req_pool_indices[: len(reqs)] = i64(reqs)
    buffers.write_num_valid_reqs.fill_(len(reqs))


def set_verify_plan(
    buffers: PlanBuffers, slots, prevs, positions, tokens=None, *, enable=1, num_valid=None
) -> None:
    """Verify entries given by hand (tokens default to -1); entries past them keep junk."""
    n = len(slots)
    tokens = [-1] * n if tokens is None else tokens
    for name, values in (
        ("verify_slot_indices", slots),
        ("verify_prev_slot_indices", prevs),
        ("verify_expected_positions", positions),
        ("verify_expected_tokens", tokens),
    ):
        getattr(buffers, name)[:n] = i64(values)
    buffers.verify_num_valid.fill_(n if num_valid is None else num_valid)
    buffers.verify_enable.fill_(enable)


# --- real-KV sources ------------------------------------------------------------------
def make_source(
    gen: torch.Generator,
    rows: int,
    row_bytes: int,
    dtype: torch.dtype = torch.uint8,
    *,
    pad_bytes: int = 0,
    offset_bytes: int = 0,
    spare_rows: int = 0,
    device="cpu",
) -> torch.Tensor:
    """A 2-D source of ``rows`` rows of ``row_bytes`` random bytes, as ``dtype``. With
    ``pad_bytes``/``offset_bytes`` (multiples of 16) it is a strided view into a wider
    buffer, starting ``offset_bytes`` into each row of it; with ``spare_rows`` the buffer
    has more rows than the source (a read past the source finds data, not a fault)."""
    width = row_bytes + pad_bytes
    raw = torch.randint(0, 256, (rows + spare_rows, width), generator=gen, dtype=torch.int64)
    base = raw.to(torch.uint8).to(device).view(dtype)
    item = base.element_size()
    return base[:rows, offset_bytes // item : (offset_bytes + row_bytes) // item]


def py_real_kv(real_kv: RealKV | None, slot: int) -> int | None:
    """The contract's real_kv(s) from the bytes, in plain Python, each source with its own
    geometry; None when the slot's page row lies past a source (the kernels skip it). A
    2-D source's slot is bytes of its row; a source of 3 or more dimensions ``[pages,
    page_size, ...]`` is read by indexing, ``tensor[page, s % page_size]``."""
    if real_kv is None or real_kv.mode == RealKVMode.NONE or not real_kv.sources:
        return 0
    if any(slot // src.page_size >= src.tensor.shape[0] for src in real_kv.sources):
        return None
    h = 0
    for src in real_kv.sources:
        width = 16 if real_kv.mode == RealKVMode.PARTIAL else src.read_bytes
        page, within = divmod(slot, src.page_size)
        if src.tensor.dim() == 2:
            row = bytes(src.tensor[page].contiguous().view(torch.uint8).tolist())
            data = row[within * src.bytes_per_token : within * src.bytes_per_token + width]
        else:
            one = src.tensor[page, within].contiguous().reshape(-1)
            data = bytes(one.view(torch.uint8).tolist())[:width]
        assert len(data) == width
        acc = 0
        for k in range(0, width, 8):
            acc = sm_int(acc ^ int.from_bytes(data[k : k + 8], "little"))
        h = sm_int(h ^ acc)
    return h


def slot_bytes(src: torch.Tensor, page_size: int, bytes_per_token: int, slot: int) -> torch.Tensor:
    """A writable uint8 view of one slot's bytes in a source (to corrupt them)."""
    row = src[slot // page_size].view(torch.uint8)
    start = (slot % page_size) * bytes_per_token
    return row[start : start + bytes_per_token]


def make_source_3d(
    gen: torch.Generator,
    rows: int,
    page_size: int,
    slot_shape: tuple[int, ...],
    dtype: torch.dtype = torch.bfloat16,
    *,
    interleaved: bool = False,
    spare_rows: int = 0,
    device="cpu",
) -> torch.Tensor:
    """A source ``[rows, page_size, *slot_shape]`` of random bytes as ``dtype``,
    contiguous within a slot. ``interleaved``: the K half of a ``[rows, page_size, 2,
    *slot_shape]`` buffer (K and V of a slot side by side), so that slots lie twice their
    own bytes apart; ``spare_rows``: the buffer has more rows (a read past the source
    finds data, not a fault)."""
    item = torch.empty(0, dtype=dtype).element_size()
    halves = (2,) if interleaved else ()
    shape = (rows + spare_rows, page_size, *halves, *slot_shape)
    numel = 1
    for n in shape:
        numel *= n
    raw = torch.randint(0, 256, (numel * item,), generator=gen, dtype=torch.int64)
    base = raw.to(torch.uint8).to(device).view(dtype).view(shape)
    return (base[:, :, 0] if interleaved else base)[:rows]


def flip_source_byte(source, page: int, within: int, byte: int) -> None:
    """XOR one byte of slot ``within`` of page ``page`` of a ``RealKVSource`` (``byte``
    counted from the slot's start, below its ``bytes_per_token``; for a 2-D source that
    may be a byte the hash does not read)."""
    t = source.tensor
    if t.dim() == 2:
        t[page].view(torch.uint8)[within * source.bytes_per_token + byte] ^= 0x10
    else:
        t[page, within].view(torch.uint8).view(-1)[byte] ^= 0x10


def past_the_door(path: str, stage: str, store, plan, kwargs: dict[str, Any]) -> None:
    """``stage`` on ``path`` (``kernels``, ``reference``) with ``kwargs`` whose ``real_kv``
    is given to the stage without the launch's validation of it (the rest is validated):
    the kernels' dispatch or the reference's body, as a launch would call them. How tests
    reach the stages' real-KV bounds checks, behind the rule that a launch's sources cover
    its store."""
    from kv_canary_buffers import verify as verify_stage
    from kv_canary_buffers import write as write_stage
    from kv_canary_kernels.verify import dispatch_verify
    from kv_canary_kernels.write import dispatch_write

    kwargs = dict(kwargs)
    real_kv = kwargs.pop("real_kv")
    if stage == "write":
        args = write_stage.validate_write_args(store, plan, **kwargs)._replace(real_kv=real_kv)
        (dispatch_write if path == "kernels" else write_stage._write)(store, plan, args)
    else:
        args = verify_stage.validate_verify_args(store, plan, **kwargs)._replace(real_kv=real_kv)
        (dispatch_verify if path == "kernels" else verify_stage._verify)(store, plan, args)


def kernels_write(store, plan, kw: dict[str, Any]) -> None:
    """The kernels' write of ``kw``; with sources that do not cover the store (refused by
    the launch, nothing written: asserted), past the validation: the kernels' bounds
    check (:func:`past_the_door`)."""
    if covers(kw.get("real_kv"), store.num_slots):
        launch_write(store, plan, **kw)
        return
    before = snapshot_store(store)
    try:
        launch_write(store, plan, **kw)
    except ValueError as err:
        assert "must cover the store" in str(err), err
    else:
        raise AssertionError("launch_write accepted sources that do not cover the store")
    assert_store_equal(store, before)
    past_the_door("kernels", "write", store, plan, kw)


def covers(real_kv: RealKV | None, num_slots: int) -> bool:
    """Whether every source of ``real_kv`` covers ``num_slots`` slots (or nothing is
    hashed): what a launch requires."""
    if real_kv is None or real_kv.mode == RealKVMode.NONE:
        return True
    return all(s.tensor.shape[0] * s.page_size >= num_slots for s in real_kv.sources)


# --- the loop model ----------------------------------------------------------------------
class ModelState(NamedTuple):
    records: list[list[int]]
    rows: list[tuple[int, ...]]  # every row appended, with its context, in contract order
    runs: int
    processed: int
    status: int
    owners: list[int]
    skipped: int


def model_state(store: CanaryStore) -> ModelState:
    """The model of ``store`` now (no rows appended yet)."""
    return ModelState(
        store.records.tolist(),
        [],
        int(store.kernel_runs),
        int(store.slots_processed),
        int(store.status),
        store.owners.tolist(),
        int(store.verify_skipped),
    )


def _hash_of(records, s: int) -> int:
    return H0_SIGNED if s < 0 else hash_of(records[s])


def model_write(
    st: ModelState,
    buffers: PlanBuffers,
    *,
    input_ids,
    positions,
    out_cache_loc,
    launch_tag=0,
    expected_input_ids=None,
    expected_positions=None,
    real_kv=None,
    chain_position_check=False,
) -> ModelState:
    """Contract "Write" as a loop, with the kernels' skip-and-flag rules for bad data."""
    recs = [list(r) for r in st.records]
    owners = list(st.owners)
    rows = list(st.rows)
    processed, status = st.processed, st.status
    num_slots = len(recs)
    ocl, ids, pos = out_cache_loc.tolist(), input_ids.tolist(), positions.tolist()
    exp = None
    if expected_input_ids is not None:
        exp = (expected_input_ids.tolist(), expected_positions.tolist())
    n = len(ocl)
    cap = buffers.write_req_capacity
    nr = int(buffers.write_num_valid_reqs)
    if not 0 <= nr <= cap:
        status |= CanaryStatus.PLAN_COUNT_OUT_OF_RANGE
        nr = min(max(nr, 0), cap)
    offsets = buffers.write_offsets.tolist()
    seeds = buffers.write_seed_slot_indices.tolist()
    reqs = buffers.row_req_pool_indices.tolist()
    start_records = [list(r) for r in recs]  # rows are independent: seeds read at the start
    for r in range(nr):
        lo, hi = offsets[r], offsets[r + 1]
        if not hi > lo:
            continue
        if lo < 0 or hi > n:
            status |= CanaryStatus.WRITE_INDEX_OUT_OF_RANGE
        seed = seeds[r]
        if seed >= num_slots:
            status |= CanaryStatus.SEED_OUT_OF_RANGE
            continue
        running = _hash_of(start_records, seed)
        req = reqs[r]  # the writing row's request: each record's owner, its rows' context
        check_pos = chain_position_check and seed >= 0
        prev_pos = start_records[seed][1] if check_pos else 0
        for i in range(min(max(lo, 0), n), min(max(hi, 0), n)):
            s = ocl[i]
            if s < 0:
                continue
            if s >= num_slots:
                status |= CanaryStatus.WRITE_SLOT_OUT_OF_RANGE
                continue
            kv = py_real_kv(real_kv, s)
            if kv is None:
                status |= CanaryStatus.REAL_KV_ROW_OUT_OF_RANGE
                continue
            tok, p = ids[i], pos[i]
            if exp is not None and (tok != exp[0][i] or p != exp[1][i]):
                bits = (FailBits.WRITE_TOKEN if tok != exp[0][i] else 0) | (
                    FailBits.WRITE_POSITION if p != exp[1][i] else 0
                )
                rows.append(
                    (launch_tag, s, p, tok, exp[0][i], running, exp[1][i], int(bits))
                    + (req, exp[1][i], req)
                )
            if check_pos:
                want = to_signed(prev_pos + 1)  # int64 arithmetic: wraps at 2**63 - 1
                if p != want:
                    rows.append(
                        (launch_tag, s, p, tok, tok, running, want, int(FailBits.WRITE_POSITION))
                        + (req, want, req)
                    )
                prev_pos = p
            if s == 0:  # the padding slot: flagged, and stamped all the same
                status |= CanaryStatus.PADDING_SLOT_WRITTEN
            recs[s] = [tok, p, running, kv]
            owners[s] = req
            running = mix3_int(running, tok, p)
            processed += 1
    return ModelState(recs, rows, st.runs + 1, processed, status, owners, st.skipped)


def _request_of(buffers: PlanBuffers, entry: int) -> int:
    """Contract "Verify", ``request_of``: the bisection over ``verify_offsets``, in
    plain Python."""
    bs = min(max(int(buffers.write_num_valid_reqs), 0), buffers.write_req_capacity)
    if bs == 0:
        return 0
    offsets = buffers.verify_offsets.tolist()
    lo, hi = 0, bs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= entry:
            lo = mid
        else:
            hi = mid
    return int(buffers.row_req_pool_indices[lo])


def model_verify(
    st: ModelState,
    buffers: PlanBuffers,
    *,
    launch_tag=0,
    check_expected_tokens=True,
    real_kv=None,
) -> ModelState:
    """Contract "Verify" as a loop, with the kernels' skip-and-flag rules for bad data."""
    recs = st.records
    rows = list(st.rows)
    processed, status = st.processed, st.status
    num_slots = len(recs)
    if int(buffers.verify_enable) == 0:
        return ModelState(recs, rows, st.runs + 1, processed, status, st.owners, st.skipped + 1)
    cap = buffers.verify_capacity
    n = int(buffers.verify_num_valid)
    if not 0 <= n <= cap:
        status |= CanaryStatus.PLAN_COUNT_OUT_OF_RANGE
        n = min(max(n, 0), cap)
    processed += n
    slots = buffers.verify_slot_indices.tolist()
    prevs = buffers.verify_prev_slot_indices.tolist()
    positions = buffers.verify_expected_positions.tolist()
    tokens = buffers.verify_expected_tokens.tolist()
    for i in range(n):
        s = slots[i]
        if s == 0:
            continue
        if s < 0 or s >= num_slots:
            status |= CanaryStatus.VERIFY_SLOT_OUT_OF_RANGE
            continue
        p = prevs[i]
        if p >= num_slots:
            status |= CanaryStatus.PREV_SLOT_OUT_OF_RANGE
            continue
        kv = py_real_kv(real_kv, s)
        if kv is None:
            status |= CanaryStatus.REAL_KV_ROW_OUT_OF_RANGE
            continue
        tok, position, prev_hash, rec_kv = recs[s]
        reachable = p != 0
        expected_chain = _hash_of(recs, p) if reachable else prev_hash
        exp_tok = tokens[i] if check_expected_tokens else -1
        bits = 0
        if reachable and prev_hash != expected_chain:
            bits |= FailBits.CHAIN
        if position != positions[i]:
            bits |= FailBits.POSITION
        if rec_kv != kv:
            bits |= FailBits.REAL_KV
        if exp_tok != -1 and tok != exp_tok:
            bits |= FailBits.VERIFY_TOKEN
        if bits:
            rows.append(
                (launch_tag, s, position, tok, exp_tok, prev_hash, expected_chain, int(bits))
                + (_request_of(buffers, i), positions[i], st.owners[s])
            )
    return ModelState(recs, rows, st.runs + 1, processed, status, st.owners, st.skipped)


def assert_store_matches_model(
    store: CanaryStore, model: ModelState, *, rows_before: int = 0, ordered: bool = False
) -> None:
    """Records, owners, counters and status equal the model's; the ring holds the model's
    rows (with their context) appended after ``rows_before`` kept rows (in order when
    ``ordered``, else as a multiset; a sub-multiset when the ring is full)."""
    assert store.records.tolist() == model.records
    assert store.owners.tolist() == model.owners
    assert int(store.kernel_runs) == model.runs
    assert int(store.slots_processed) == model.processed
    assert int(store.verify_skipped) == model.skipped
    assert int(store.status) == model.status
    count = int(store.violation_count)
    assert count == rows_before + len(model.rows)
    got = kept_rows(store, rows_before, context=True)
    if count <= store.violation_capacity:
        if ordered:
            assert got == model.rows
        else:
            assert multiset(got) == multiset(model.rows)
    else:
        assert is_sub_multiset(got, model.rows)
        if ordered:
            assert got == model.rows[: len(got)]
