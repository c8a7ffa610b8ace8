"""Differential property tests of the write and verify stages on Hypothesis-generated
plans, records, inputs and real-KV sources: the Triton kernels against the torch
references (and both against the loop model of tests/helpers/canary.py), byte for byte,
with violation rows compared as multisets (the kernels' order within a launch is
unspecified) and, when the ring overflows, the kernels' kept rows a sub-multiset of the
full set. With data out of range the kernels must skip exactly what the model skips and
raise its status bits, and the references must raise ValueError and write nothing."""

import copy
import random
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kv_canary_buffers import (
    CanaryStatus,
    PlanBuffers,
    RealKV,
    RealKVMode,
    RealKVSource,
    plan_reference,
)
from kv_canary_buffers.layout import INT64_MAX, INT64_MIN
from kv_canary_kernels.config import launch_config
from tests.helpers.canary import (
    CANARY_PATHS,
    DEVICE,
    JUNK,
    assert_store_equal,
    assert_store_matches_model,
    counters,
    covers,
    flip_source_byte,
    i64,
    kept_rows,
    make_source,
    make_source_3d,
    model_state,
    model_verify,
    model_write,
    new_plan,
    new_store,
    past_the_door,
    snapshot_store,
)

REF, KER = CANARY_PATHS["reference"], CANARY_PATHS["kernels"]
SETTINGS = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
FULL_RING = 4096
PADDING = int(CanaryStatus.PADDING_SLOT_WRITTEN)


# --- generators ------------------------------------------------------------------------------
def _value(rng: random.Random) -> int:
    """A token or position: small, or anywhere in int64."""
    r = rng.random()
    if r < 0.15:
        return rng.randint(INT64_MIN, INT64_MAX)
    if r < 0.2:
        return rng.choice([INT64_MIN, INT64_MAX, -1, 0])
    return rng.randint(-3, 60)


DTYPES = (torch.uint8, torch.int8, torch.bfloat16, torch.float16, torch.float32, torch.int64)


def _gen_source(rng: random.Random, g: torch.Generator, num_slots: int, short: bool):
    """One source of a random geometry of its own: a 2-D ``[pages, page bytes]`` tensor
    (rows perhaps longer than a page, perhaps a strided view into a wider buffer) or a
    ``[pages, page_size, heads, dim]`` one (perhaps the K half of an interleaved K/V
    buffer, its slots twice their bytes apart), page sizes 1 to 16, random dtypes and
    read widths; with ``short`` it may miss the last pages."""
    page = rng.choice([1, 1, 2, 3, 4, 16])
    pages = -(-num_slots // page)
    rows = pages + rng.choice([0, 0, 1, 3])
    if short and rng.random() < 0.5:
        rows = max(0, pages - rng.randint(1, 3))
    dtype = rng.choice(DTYPES)
    item = torch.empty(0, dtype=dtype).element_size()
    if rng.random() < 0.65:
        bpt = rng.choice([16, 32, 48, 16, 32, 48, 160, 288])  # up to three reads of 16 words
        extra = rng.choice([0, 0, 16, 32])  # longer rows than a page: bytes never read
        pad = rng.choice([0, 0, 16, 48])
        offset = rng.choice([0, 16]) if pad >= 16 else 0
        row_bytes = page * bpt + extra
        tensor = make_source(
            g, rows, row_bytes, dtype, pad_bytes=pad, offset_bytes=offset, spare_rows=3,
            device=DEVICE,
        )  # fmt: skip
        slot_bytes = bpt
    else:
        heads = rng.choice([1, 2])
        dim = rng.choice([16, 32, 48]) // item
        interleaved = rng.random() < 0.4
        tensor = make_source_3d(
            g, rows, page, (heads, dim), dtype, interleaved=interleaved, spare_rows=3,
            device=DEVICE,
        )  # fmt: skip
        slot_bytes = heads * dim * item
        bpt = slot_bytes * (2 if interleaved else 1)
    read = rng.choice(range(16, slot_bytes + 1, 16))
    return RealKVSource(
        tensor,
        page_size=page,
        bytes_per_token=bpt,
        read_bytes=None if read == bpt and rng.random() < 0.5 else read,
    )


def gen_real_kv(rng: random.Random, num_slots: int, *, short: bool = False) -> RealKV | None:
    """None, or 1 to 5 sources (the kernels take PARTIAL sources four at a time), each of
    a random geometry of its own (``_gen_source``), some given as plain tensors of the
    ``RealKV``'s own geometry; with ``short`` some source may miss the last pages."""
    if rng.random() < (0.2 if short else 0.3):
        return None
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    count = rng.choice([1, 1, 1, 2, 2, 3, 5])
    sources: list[Any] = [_gen_source(rng, g, num_slots, short) for _ in range(count)]
    # Some 2-D sources as plain tensors, of the geometry the RealKV gives them.
    plain = [s for s in sources if s.tensor.dim() == 2]
    common = rng.choice(plain) if plain and rng.random() < 0.5 else None
    geometry: dict[str, Any] = {}
    if common is not None:
        geometry = dict(
            page_size=common.page_size,
            bytes_per_token=common.bytes_per_token,
            read_bytes=common.read_bytes,
        )
        sources = [
            s.tensor if s.tensor.dim() == 2 and (s.page_size, s.bytes_per_token, s.read_bytes)
            == (common.page_size, common.bytes_per_token, common.read_bytes) else s
            for s in sources
        ]  # fmt: skip
    mode = rng.choice([RealKVMode.NONE, RealKVMode.PARTIAL, RealKVMode.ALL, RealKVMode.ALL])
    kv = RealKV(mode=mode, sources=sources, **geometry)
    event(f"real-KV sources: {len(kv.sources)} ({mode.name})")
    return kv


def gen_store(rng: random.Random, num_slots: int, capacity: int):
    """A store with random records (zero, small or anywhere in int64) and owners, the ring
    poisoned and its count possibly already near or past the capacity, random counters
    and flag."""
    store = new_store(num_slots, capacity, junk_records=False)
    recs = [[_value(rng) if rng.random() < 0.6 else 0 for _ in range(4)] for _ in range(num_slots)]
    store.records.copy_(i64(recs))
    store.violation_count.fill_(rng.choice([0, 0, 0, 1, capacity - 1, capacity, capacity + 2]))
    store.kernel_runs.fill_(rng.randint(0, 100))
    store.slots_processed.fill_(rng.randint(0, 1000))
    store.verify_skipped.fill_(rng.randint(0, 5))
    store.owners.copy_(i64([_request(rng) if rng.random() < 0.7 else 0 for _ in range(num_slots)]))
    if rng.random() < 0.5:
        store.enable_chain_position_check()
    return store


def gen_write(rng: random.Random, store, plan: PlanBuffers, *, hostile: bool) -> dict[str, Any]:
    """Fill the write part of ``plan`` and return the write's keyword arguments.

    Valid data keeps the contract's preconditions: rows never share a written slot, and no
    row's seed is a slot another row writes (the result is unspecified then). Hostile
    data adds offsets outside [0, n), seeds and slots >= num_slots, counts out of range."""
    num_slots = store.num_slots
    cap = plan.write_req_capacity
    n = rng.randint(0, 24)
    offsets = [rng.choice([0, 0, rng.randint(0, n)])]
    for _ in range(cap):
        if rng.random() < 0.8:
            offsets.append(min(n, offsets[-1] + rng.randint(0, 5)))
        else:
            offsets.append(rng.randint(0, n))
    if hostile:
        for r in range(cap + 1):
            if rng.random() < 0.15:
                offsets[r] = rng.choice([-3, -1, n + 1, n + 4, rng.randint(-5, n + 5)])
    num_rows = rng.randint(0, cap)
    if hostile and rng.random() < 0.2:
        num_rows = rng.choice([-1, -(2**31), cap + 1, 2**31 - 1])
    rows_read = min(max(num_rows, 0), cap)
    if not hostile and num_rows > 0 and rng.random() < 0.3:
        offsets[0] = rng.choice([n + 5, 10**12])  # row 0 idle (lo > hi): never read
    if not hostile and rng.random() < 0.3:
        offsets[rows_read] = rng.choice([-5, -(10**12)])  # the last row read: idle

    # which rows cover each index (clamped ranges of rows with hi > lo)
    cover: list[list[int]] = [[] for _ in range(n)]
    busy = []
    for r in range(rows_read):
        lo, hi = offsets[r], offsets[r + 1]
        if hi > lo:
            busy.append(r)
            for i in range(min(max(lo, 0), n), min(max(hi, 0), n)):
                cover[i].append(r)

    pool = list(range(num_slots))
    rng.shuffle(pool)
    written: dict[int, list[int]] = {r: [] for r in busy}
    ocl = []
    for i in range(n):
        if len(cover[i]) == 0:  # never read: anything, in range or not
            ocl.append(
                rng.choice([-1, 0, num_slots, num_slots + 7, 10**9, rng.randint(0, num_slots)])
            )
        elif len(cover[i]) > 1 or rng.random() < 0.15:
            ocl.append(rng.choice([-1, -2]))  # shared by two rows: skipped by both
        else:
            r = cover[i][0]
            if hostile and rng.random() < 0.15:
                ocl.append(rng.choice([num_slots, num_slots + 3, 2**62]))
            elif written[r] and rng.random() < 0.2:
                ocl.append(rng.choice(written[r]))  # a duplicate within the row
            elif pool:
                written[r].append(pool.pop())
                ocl.append(written[r][-1])
            else:
                ocl.append(-1)
    seeds = []
    for r in range(cap):
        if r not in written:
            seeds.append(rng.choice([-1, 5, num_slots, 10**12, -(10**12)]))  # never read
            continue
        options = [-1, rng.randint(-9, -1)] + written[r] + pool[:3]
        if hostile and rng.random() < 0.2:
            options = [num_slots, num_slots + 1, INT64_MAX]
        seeds.append(rng.choice(options))

    plan.write_offsets.copy_(i64(offsets))
    plan.write_seed_slot_indices.copy_(i64(seeds))
    plan.write_num_valid_reqs.fill_(num_rows)
    plan.row_req_pool_indices.copy_(i64([_request(rng) for _ in range(cap)]))

    # positions that mostly follow each row's seed (so the chain-position check passes
    # and fails), tokens mostly small
    positions = [_value(rng) for _ in range(n)]
    for r in busy:
        seed = seeds[r]
        p = int(store.records[seed, 1]) if 0 <= seed < num_slots else rng.randint(0, 9)
        for i in range(min(max(offsets[r], 0), n), min(max(offsets[r + 1], 0), n)):
            if rng.random() < 0.85:
                p = (p + 1) if p < INT64_MAX else p
                positions[i] = p
    ids = [_value(rng) for _ in range(n)]
    kwargs: dict[str, Any] = dict(
        input_ids=guarded(ids, rng),
        positions=guarded(positions, rng),
        out_cache_loc=guarded(ocl, rng, pool[:GUARD]),
        launch_tag=rng.choice([0, 7, -1, INT64_MIN, INT64_MAX, rng.randint(INT64_MIN, INT64_MAX)]),
    )
    if rng.random() < 0.5:
        exp_ids = [t if rng.random() < 0.8 else _value(rng) for t in ids]
        exp_pos = [p if rng.random() < 0.8 else _value(rng) for p in positions]
        kwargs.update(
            expected_input_ids=guarded(exp_ids, rng), expected_positions=guarded(exp_pos, rng)
        )
    return kwargs


def _request(rng: random.Random) -> int:
    """A row's ``row_req_pool_indices`` value: small (0 = padding), or any int64."""
    r = rng.random()
    if r < 0.1:
        return rng.choice([0, -1, INT64_MIN, INT64_MAX])
    return rng.randint(1, 12) if r < 0.9 else rng.randint(INT64_MIN, INT64_MAX)


def gen_rows(rng: random.Random, plan: PlanBuffers, *, requests: bool) -> None:
    """Fill ``verify_offsets`` (which the verify bisects to name a failing entry's row):
    mostly a prefix sum from 0, sometimes any values (both paths must still agree and stay
    in bounds); with ``requests`` also each row's request and the row count (a plan
    written by hand: the count may lie outside ``[0, write_req_capacity]``)."""
    cap = plan.write_req_capacity
    if rng.random() < 0.75:
        offsets = [0]
        for _ in range(cap):
            offsets.append(offsets[-1] + rng.choice([0, 1, 2, 5, 40]))
    else:
        offsets = [rng.choice([0, -1, 3, INT64_MAX, INT64_MIN]) for _ in range(cap + 1)]
    plan.verify_offsets.copy_(i64(offsets))
    if requests:
        plan.row_req_pool_indices.copy_(i64([_request(rng) for _ in range(cap)]))
        plan.write_num_valid_reqs.fill_(rng.choice([0, 1, cap, rng.randint(0, cap), -1, cap + 3]))


GUARD = 4


def guarded(values: list[int], rng: random.Random, tail: list[int] | None = None):
    """``i64(values)`` inside a longer tensor whose tail holds plausible data (for
    out_cache_loc: slots no row writes), so that a read past ``n`` shows; sometimes one
    element in, so that it starts 8 bytes off a 16-byte boundary."""
    tail = list(tail or []) + [rng.randint(0, 5) for _ in range(GUARD)]
    skip = rng.choice([0, 0, 1])
    t = i64([3] * skip + values + tail[:GUARD])[skip : skip + len(values)]
    assert t.is_contiguous()
    return t


def gen_verify(
    rng: random.Random,
    store,
    plan: PlanBuffers,
    *,
    hostile: bool,
    chains: list[list[int]] | None = None,
    requests: bool = False,
) -> dict[str, Any]:
    """Fill the verify part of ``plan`` and return the verify's keyword arguments.

    Entries mix chains that were just written (clean unless the records changed),
    entries whose predecessor is the previous entry's slot (the kernels take its hash
    from the lane to the left), slot-0 entries and random ones; tokens and positions
    mostly those of the records. Entries past the count hold junk. The rows that name a
    failing entry: :func:`gen_rows`."""
    num_slots = store.num_slots
    cap = plan.verify_capacity
    recs = store.records.tolist()
    slots, prevs, positions, tokens = [], [], [], []
    for chain in chains or []:
        prev = -1
        for s in chain:
            slots.append(s)
            prevs.append(prev)
            prev = s
    while len(slots) < cap:
        r = rng.random()
        if r < 0.1:
            s = 0
        elif hostile and r < 0.2:
            s = rng.choice([-1, -5, num_slots, num_slots + 2, 2**40])
        else:
            s = rng.randrange(num_slots)
        slots.append(s)
        if slots and len(slots) > 1 and rng.random() < 0.5:
            prevs.append(slots[-2])
        elif hostile and rng.random() < 0.15:
            prevs.append(rng.choice([num_slots, num_slots + 1, INT64_MAX]))
        else:
            prevs.append(rng.randint(-3, num_slots - 1))
    slots, prevs = slots[:cap], prevs[:cap]
    for s in slots:
        rec = recs[s] if 0 <= s < num_slots else [0, 0, 0, 0]
        positions.append(rec[1] if rng.random() < 0.8 else _value(rng))
        t = rng.random()
        tokens.append(rec[0] if t < 0.6 else -1 if t < 0.8 else _value(rng))
    n = rng.randint(0, cap) if rng.random() < 0.7 else min(len(slots), cap)
    if hostile and rng.random() < 0.25:
        n = rng.choice([-1, -(2**31), cap + 1, 2**31 - 1])
    if not hostile:  # past the count: junk a look would flag
        for i in range(max(n, 0), cap):
            slots[i], prevs[i] = rng.choice([-5, num_slots, JUNK]), num_slots + 3
    plan.verify_slot_indices.copy_(i64(slots))
    plan.verify_prev_slot_indices.copy_(i64(prevs))
    plan.verify_expected_positions.copy_(i64(positions))
    plan.verify_expected_tokens.copy_(i64(tokens))
    plan.verify_num_valid.fill_(n)
    plan.verify_enable.fill_(rng.choice([1, 1, 1, 1, 0, 7]))
    gen_rows(rng, plan, requests=requests)
    return dict(
        launch_tag=rng.randint(INT64_MIN, INT64_MAX),
        check_expected_tokens=rng.random() < 0.7,
    )


def written_chains(kwargs, plan) -> list[list[int]]:
    """The slots each row wrote, in order (for clean verify entries)."""
    ocl = kwargs["out_cache_loc"].tolist()
    n = len(ocl)
    off = plan.write_offsets.tolist()
    chains = []
    for r in range(min(max(int(plan.write_num_valid_reqs), 0), plan.write_req_capacity)):
        lo, hi = max(off[r], 0), min(off[r + 1], n)
        chain = [s for s in ocl[lo:hi] if 0 <= s] if off[r + 1] > off[r] else []
        if chain and len(set(chain)) == len(chain):
            chains.append(chain)
    return chains


# --- runners ------------------------------------------------------------------------------
class Trio:
    """The reference and the kernels on identical deep copies, and the reference again
    on a copy with a ring large enough to keep every row (the full set)."""

    def __init__(self, store):
        self.ref = copy.deepcopy(store)
        self.ker = copy.deepcopy(store)
        self.full = copy.deepcopy(store).resize(violation_capacity=FULL_RING)

    def run(self, stage: str, plan: PlanBuffers, kwargs: dict[str, Any]) -> None:
        model_fn = model_write if stage == "write" else model_verify
        flag = bool(int(self.ref.chain_position_check))
        extra = {"chain_position_check": flag} if stage == "write" else {}
        model = model_fn(model_state(self.ref), plan, **kwargs, **extra)
        assert model.status & ~PADDING == 0  # valid data (slot 0 is in range: flagged)
        if model.status:
            event(f"{stage}: padding slot written")
        event(f"{stage}: {'no rows' if not model.rows else 'rows'}")
        written = model.processed - int(self.ref.slots_processed)
        event(f"{stage}: {'nothing processed' if not written else 'processed'}")
        before = {name: int(s.violation_count) for name, s in self.stores()}
        kept = {
            name: s.violations[: min(before[name], s.violation_capacity)].clone()
            for name, s in self.stores()
        }
        for name, s in self.stores():
            path = KER if name == "ker" else REF
            getattr(path, stage)(s, plan, **kwargs)
        for name, s in self.stores():
            assert_store_matches_model(s, model, rows_before=before[name], ordered=name != "ker")
            k = kept[name].shape[0]
            assert torch.equal(s.violations[:k], kept[name]), f"{name}: earlier rows changed"
            if name != "full":  # rows past the kept ones hold the poison
                end = min(int(s.violation_count), s.violation_capacity)
                assert (s.violations[end:] == JUNK).all(), f"{name}: a row past the count"
        assert torch.equal(self.ref.records, self.ker.records)
        assert torch.equal(self.ref.owners, self.ker.owners)
        assert counters(self.ref) == counters(self.ker)
        assert int(self.ref.verify_skipped) == int(self.ker.verify_skipped)
        assert torch.equal(self.ref.chain_position_check, self.ker.chain_position_check)
        if int(self.ref.violation_count) > self.ref.violation_capacity:
            event("ring full")
        if int(self.ref.violation_count) <= self.ref.violation_capacity:
            assert sorted(map(tuple, self.ref.violations.tolist())) == sorted(
                map(tuple, self.ker.violations.tolist())
            )
            with_context = [sorted(kept_rows(s, context=True)) for s in (self.ref, self.ker)]
            assert with_context[0] == with_context[1]

    def stores(self):
        return (("ref", self.ref), ("ker", self.ker), ("full", self.full))


@st.composite
def scenario(draw):
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        num_slots=draw(st.integers(1, 48)),
        capacity=draw(st.sampled_from([1, 2, 5, 16])),
        write_cap=draw(st.sampled_from([1, 3, 8, 32, 37])),
        verify_cap=draw(st.sampled_from([1, 4, 16, 40, 260])),
        chain_tokens=draw(CHAIN_TOKENS),
    )


CHAIN_TOKENS = st.sampled_from([0, 2, 16])
"""``write_chain_tokens``: 0 and 2 send most generated rows (a few tokens each) to the
write's chain programs, 16 (the default) keeps them in the side programs."""


@settings(max_examples=30, **SETTINGS)
@given(scenario())
def test_write_then_verify_kernels_equal_reference(sc):
    with launch_config(write_chain_tokens=sc["chain_tokens"]):
        _write_then_verify(sc)


def _write_then_verify(sc):
    rng = random.Random(sc["seed"])
    store = gen_store(rng, sc["num_slots"], sc["capacity"])
    plan = new_plan(sc["write_cap"], sc["verify_cap"])
    real_kv = gen_real_kv(rng, sc["num_slots"])
    trio = Trio(store)
    kwargs = gen_write(rng, store, plan, hostile=False)
    trio.run("write", plan, {**kwargs, "real_kv": real_kv})
    chains = written_chains(kwargs, plan)
    vkw = gen_verify(rng, trio.ref, plan, hostile=False, chains=chains)
    trio.run("verify", plan, {**vkw, "real_kv": real_kv})
    if real_kv is not None and real_kv.sources and rng.random() < 0.7:
        src = real_kv.sources[rng.randrange(len(real_kv.sources))]
        # overwrite a KV byte of some slot (hashed or not, read or not)
        flip_source_byte(
            src,
            rng.randrange(src.tensor.shape[0]),
            rng.randrange(src.page_size),
            rng.randrange(src.bytes_per_token if src.tensor.dim() == 2 else src.read_bytes),
        )
    if rng.random() < 0.5:  # corrupt a record, the same way in every store
        slot, col = rng.randrange(sc["num_slots"]), rng.randrange(4)
        for s in (trio.ref, trio.ker, trio.full):
            s.records[slot, col] += 1
    vkw = gen_verify(rng, trio.ref, plan, hostile=False, chains=chains)
    trio.run("verify", plan, {**vkw, "real_kv": real_kv})


@st.composite
def batches(draw):
    """A random batch for plan_reference: requests of distinct slots in req_to_token,
    optionally a window (with an identity-plus-offset LUT) and an expected-token pool."""
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        bs=draw(st.integers(1, 6)),
        window=draw(st.sampled_from([0, 0, 2, 5])),
        pool=draw(st.booleans()),
        capacity=draw(st.sampled_from([2, 8, 64])),
    )


@settings(max_examples=15, **SETTINGS)
@given(batches())
def test_engine_steps_from_plan_reference(b):
    """Two engine steps planned by plan_reference: step 1 writes each request's first
    tokens; step 2 verifies them (clean, unless a record or KV byte was changed between)
    and writes the next ones. Kernels and reference agree at every stage."""
    rng = random.Random(b["seed"])
    bs, rows, cols = b["bs"], 5, 12
    num_slots = 1 + rows * cols
    perm = list(range(1, num_slots))
    rng.shuffle(perm)
    table = torch.tensor(perm, dtype=torch.int32).reshape(rows, cols)
    requests = list(range(1, rows))  # each at most once a batch; 0 is a padding row
    rng.shuffle(requests)
    rp = [requests.pop() if requests and rng.random() < 0.8 else 0 for _ in range(bs)]
    first = [rng.randint(0, 6) for _ in range(bs)]
    second = [rng.randint(0, 3) for _ in range(bs)]
    pool = torch.randint(
        0, 50, (rows, cols + 2), generator=torch.Generator().manual_seed(b["seed"] % 2**31)
    )
    common: dict[str, Any] = dict(req_pool_indices=i64(rp), req_to_token=table.to(DEVICE))
    if b["window"]:
        common.update(
            swa_window_size=b["window"],
            full_to_swa_index_mapping=torch.arange(num_slots, device=DEVICE),
        )
    if b["pool"]:
        common.update(
            req_to_verify_expected_tokens=pool.to(torch.int32).to(DEVICE),
            req_to_verify_expected_tokens_valid_lens=i64([cols + 2] * bs),
        )
    real_kv = gen_real_kv(rng, num_slots)
    store = new_store(num_slots, b["capacity"])
    if rng.random() < 0.5:
        store.enable_chain_position_check()
    trio = Trio(store)
    plan = new_plan(max(bs, 1), 64)
    # step 1: prefix 0, write `first` tokens of each request (tokens from the pool)
    plan_reference(plan, prefix_lens=i64([0] * bs), extend_seq_lens=i64(first), **common)
    ids, pos, ocl = [], [], []
    for r in range(bs):
        for p in range(first[r] if rp[r] else 0):
            ids.append(int(pool[rp[r], p]))
            pos.append(p)
            ocl.append(int(table[rp[r], p]))
    trio.run(
        "write",
        plan,
        dict(
            input_ids=i64(ids),
            positions=i64(pos),
            out_cache_loc=i64(ocl),
            real_kv=real_kv,
            launch_tag=1,
        ),
    )
    if rng.random() < 0.4:
        for s in (trio.ref, trio.ker, trio.full):
            s.records[ocl[0] if ocl else 0, 1] += 1
    # step 2: verify the prefix, then write the next tokens
    plan_reference(plan, prefix_lens=i64(first), extend_seq_lens=i64(second), **common)
    trio.run("verify", plan, dict(launch_tag=2, check_expected_tokens=True, real_kv=real_kv))
    ids, pos, ocl = [], [], []
    for r in range(bs):
        for p in range(first[r], first[r] + (second[r] if rp[r] else 0)):
            ids.append(int(pool[rp[r], p]))
            pos.append(p)
            ocl.append(int(table[rp[r], p]) if rng.random() < 0.9 else -1)
    trio.run(
        "write",
        plan,
        dict(
            input_ids=i64(ids),
            positions=i64(pos),
            out_cache_loc=i64(ocl),
            real_kv=real_kv,
            launch_tag=3,
            expected_input_ids=i64(ids),
            expected_positions=i64(pos),
        ),
    )


# --- data out of range -------------------------------------------------------------------------
@st.composite
def hostile(draw):
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        num_slots=draw(st.integers(1, 40)),
        write_cap=draw(st.sampled_from([1, 4, 32, 33])),
        verify_cap=draw(st.sampled_from([1, 6, 40, 257])),
    )


# One test per stage and write split rather than drawn, so that pytest-xdist can spread
# them (each real-KV mode is a kernel variant of its own, whose compile on CUDA takes
# seconds: a write variant 3.5-10 s on the H200 host).
@pytest.mark.parametrize(
    ("stage", "chain_tokens"), [("write", 0), ("write", 2), ("write", 16), ("verify", 16)]
)
@settings(max_examples=15, **SETTINGS)
@given(h=hostile())
def test_out_of_range_data_kernels_skip_and_flag_references_raise(stage, chain_tokens, h):
    with launch_config(write_chain_tokens=chain_tokens):
        _out_of_range(dict(h, stage=stage))


def _out_of_range(h):
    rng = random.Random(h["seed"])
    store = gen_store(rng, h["num_slots"], 8)
    store.violation_count.fill_(0)
    store.status.fill_(0)
    plan = new_plan(h["write_cap"], h["verify_cap"])
    real_kv = gen_real_kv(rng, h["num_slots"], short=True)
    if h["stage"] == "write":
        kwargs = gen_write(rng, store, plan, hostile=True)
        model = model_write(
            model_state(store),
            plan,
            **kwargs,
            real_kv=real_kv,
            chain_position_check=bool(int(store.chain_position_check)),
        )
    else:
        kwargs = gen_verify(rng, store, plan, hostile=True, requests=True)
        model = model_verify(model_state(store), plan, **kwargs, real_kv=real_kv)
    ker = copy.deepcopy(store).resize(violation_capacity=FULL_RING)
    if covers(real_kv, h["num_slots"]):
        getattr(KER, h["stage"])(ker, plan, **kwargs, real_kv=real_kv)
    else:
        # Refused at the door on both paths, nothing written; past it (as the bounds
        # check behind that rule) the kernels skip and flag what the model does.
        event(f"{h['stage']}: sources not covering the store")
        for path, target in ((KER, ker), (REF, copy.deepcopy(store))):
            before = snapshot_store(target)
            with pytest.raises(ValueError, match=r"^kv-canary: real_kv.sources\[\d+\] must cover"):
                getattr(path, h["stage"])(target, plan, **kwargs, real_kv=real_kv)
            assert_store_equal(target, before)
        past_the_door("kernels", h["stage"], ker, plan, {**kwargs, "real_kv": real_kv})
    assert_store_matches_model(ker, model)
    assert ker.take_status() == CanaryStatus(model.status)
    for bit in CanaryStatus:
        if bit & model.status:
            event(f"{h['stage']}: {bit.name}")
    if not model.status:
        event(f"{h['stage']}: in range")
    ref = copy.deepcopy(store)
    before = snapshot_store(ref)
    if model.status & ~PADDING:  # data out of range (the padding bit is valid data's)
        with pytest.raises(ValueError, match=r"^kv-canary: .*(must be|must lie in|must cover)"):
            getattr(REF, h["stage"])(ref, plan, **kwargs, real_kv=real_kv)
        assert_store_equal(ref, before)
        if not covers(real_kv, h["num_slots"]):
            with pytest.raises(ValueError, match=r"^kv-canary: .*(must be|must lie in)"):
                past_the_door("reference", h["stage"], ref, plan, {**kwargs, "real_kv": real_kv})
            assert_store_equal(ref, before)
    else:
        full = ref.resize(violation_capacity=FULL_RING)
        if covers(real_kv, h["num_slots"]):
            getattr(REF, h["stage"])(full, plan, **kwargs, real_kv=real_kv)
        else:
            past_the_door("reference", h["stage"], full, plan, {**kwargs, "real_kv": real_kv})
        assert_store_matches_model(full, model, ordered=True)
