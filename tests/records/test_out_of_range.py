"""Data out of range (canary-contract.md, "Out-of-range data"), one hand case per
CanaryStatus bit: the kernels skip exactly the entry concerned (no record, no check, the
chain does not advance over a skipped token), raise that bit and go on; the torch
references raise ValueError naming the argument, the index and the value, and write
nothing. Inputs are heads of longer tensors and real-KV sources views of larger buffers,
so a read past either would find plausible data and show."""

import pytest
import torch

from kv_canary_buffers import CanaryStatus, RealKV, RealKVMode
from kv_canary_buffers.hashing import H0_SIGNED, mix3_int
from kv_canary_buffers.layout import INT64_MAX
from tests.helpers.canary import (
    CANARY_PATHS,
    DEVICE,
    assert_plan_equal,
    assert_store_equal,
    assert_store_matches_model,
    counters,
    i64,
    make_source,
    model_state,
    model_verify,
    model_write,
    new_plan,
    new_store,
    set_verify_plan,
    set_write_plan,
    snapshot_plan,
    snapshot_store,
)

S = CanaryStatus
NUM_SLOTS = 16


def head(values, tail=(7, 8, 9, 10)):
    """``values`` as the head of a longer tensor whose tail holds in-range slots."""
    return i64(list(values) + list(tail))[: len(values)]


def write_inputs(ocl, ids=None, pos=None):
    n = len(ocl)
    ids = list(range(100, 100 + n)) if ids is None else ids
    pos = list(range(n)) if pos is None else pos
    return dict(input_ids=head(ids), positions=head(pos), out_cache_loc=head(ocl))


def short_kv():
    """Sources of 4 pages of 2 slots (slots 0..7) in buffers of 8 pages."""
    g = torch.Generator().manual_seed(5)
    sources = (
        make_source(g, 4, 64, spare_rows=4, device=DEVICE),
        make_source(g, 6, 64, torch.bfloat16, spare_rows=2, device=DEVICE),
    )
    return RealKV(mode=RealKVMode.ALL, sources=sources, page_size=2, bytes_per_token=32)


def h(*pairs, start=H0_SIGNED):
    for t, p in pairs:
        start = mix3_int(start, t, p)
    return start


# name: (stage, set-up(plan) -> kwargs, bit, reference message, explicit check(store))
CASES = {
    "seed past the store": (
        "write",
        lambda p: (set_write_plan(p, [0, 2, 4], [-1, NUM_SLOTS]), write_inputs([3, 4, 5, 6]))[1],
        S.SEED_OUT_OF_RANGE,
        r"plan_buffers.write_seed_slot_indices\[1\] = 16 must be < 16",
        lambda s: s.records[5:7, 0].tolist() != [102, 103] and counters(s)[2] == 2,
    ),
    "seed far past the store": (
        "write",
        lambda p: (set_write_plan(p, [0, 2], [INT64_MAX]), write_inputs([3, 4]))[1],
        S.SEED_OUT_OF_RANGE,
        rf"plan_buffers.write_seed_slot_indices\[0\] = {INT64_MAX} must be < 16",
        lambda s: counters(s)[2] == 0,
    ),
    "slot past the store": (
        "write",
        lambda p: (set_write_plan(p, [0, 3], [-1]), write_inputs([3, NUM_SLOTS, 5]))[1],
        S.WRITE_SLOT_OUT_OF_RANGE,
        r"out_cache_loc\[1\] = 16 must be < num_slots = 16",
        # the chain skips the token: slot 5's predecessor hash is token 0's
        lambda s: s.records[5, 2].item() == h((100, 0)) and counters(s)[2] == 2,
    ),
    "slot far past the store": (
        "write",
        lambda p: (set_write_plan(p, [0, 2], [-1]), write_inputs([2**62, 5]))[1],
        S.WRITE_SLOT_OUT_OF_RANGE,
        rf"out_cache_loc\[0\] = {2**62} must be < num_slots = 16",
        lambda s: s.records[5, 2].item() == H0_SIGNED,
    ),
    "range past n": (
        "write",
        lambda p: (set_write_plan(p, [0, 2, 6], [-1, -1]), write_inputs([3, 4, 5, 6]))[1],
        S.WRITE_INDEX_OUT_OF_RANGE,
        r"plan_buffers.write_offsets\[1:3\] = \[2, 6\] "
        r"must lie in \[0, n = len\(out_cache_loc\) = 4\]",
        # clamped to [2, 4): slots 5, 6 written; the guard tail (slots 7..10) is not read
        lambda s: s.records[5:7, 0].tolist() == [102, 103] and counters(s)[2] == 4,
    ),
    "range before 0": (
        "write",
        lambda p: (set_write_plan(p, [-2, 2], [-1]), write_inputs([3, 4]))[1],
        S.WRITE_INDEX_OUT_OF_RANGE,
        r"plan_buffers.write_offsets\[0:2\] = \[-2, 2\] must lie in \[0, n",
        lambda s: s.records[3:5, 0].tolist() == [100, 101] and s.records[3, 2].item() == H0_SIGNED,
    ),
    "range wholly past n": (
        "write",
        lambda p: (set_write_plan(p, [0, 1, 9, 12], [-1, -1, 3]), write_inputs([3]))[1],
        S.WRITE_INDEX_OUT_OF_RANGE,
        r"plan_buffers.write_offsets\[1:3\] = \[1, 9\] must lie in \[0, n",
        lambda s: counters(s)[2] == 1,
    ),
    "write real-KV page past a source": (
        "write",
        lambda p: (
            set_write_plan(p, [0, 3], [-1]),
            {**write_inputs([3, 9, 5]), "real_kv": short_kv()},
        )[1],
        S.REAL_KV_ROW_OUT_OF_RANGE,
        r"out_cache_loc\[1\] = 9 must be a slot whose real-KV page row lies inside every source",
        lambda s: s.records[5, 2].item() == h((100, 0)) and s.records[9, 0].item() != 101,
    ),
    "write count past the capacity": (
        "write",
        lambda p: (
            set_write_plan(p, [0, 1, 2, 3, 4], [-1, -1, -1, -1], num_rows=5),
            write_inputs([3, 4, 5, 6]),
        )[1],
        S.PLAN_COUNT_OUT_OF_RANGE,
        r"plan_buffers.write_num_valid_reqs\[0\] = 5 must be in \[0, 4\]",
        lambda s: counters(s)[2] == 4,  # clamped to the 4 rows of the capacity
    ),
    "write count negative": (
        "write",
        lambda p: (set_write_plan(p, [0, 2], [-1], num_rows=-1), write_inputs([3, 4]))[1],
        S.PLAN_COUNT_OUT_OF_RANGE,
        r"plan_buffers.write_num_valid_reqs\[0\] = -1 must be in \[0, 4\]",
        lambda s: counters(s)[1:3] == (1, 0),
    ),
    "verify slot negative": (
        "verify",
        lambda p: set_verify_plan(p, [3, -2, 4], [0, 0, 0], [1, 1, 1]) or {},
        S.VERIFY_SLOT_OUT_OF_RANGE,
        r"plan_buffers.verify_slot_indices\[1\] = -2 must be in \[0, num_slots = 16\)",
        lambda s: sorted(r[1] for r in s.violations[:2].tolist()) == [3, 4],
    ),
    "verify slot past the store": (
        "verify",
        lambda p: set_verify_plan(p, [3, NUM_SLOTS, 4], [0, 0, 0], [1, 1, 1]) or {},
        S.VERIFY_SLOT_OUT_OF_RANGE,
        r"plan_buffers.verify_slot_indices\[1\] = 16 must be in \[0, num_slots = 16\)",
        lambda s: counters(s)[0] == 2 and counters(s)[2] == 3,
    ),
    "predecessor past the store": (
        "verify",
        lambda p: set_verify_plan(p, [3, 4, 5], [-1, NUM_SLOTS, 4], [1, 1, 1]) or {},
        S.PREV_SLOT_OUT_OF_RANGE,
        r"plan_buffers.verify_prev_slot_indices\[1\] = 16 must be < num_slots = 16",
        lambda s: sorted(r[1] for r in s.violations[:2].tolist()) == [3, 5],
    ),
    "verify real-KV page past a source": (
        "verify",
        lambda p: set_verify_plan(p, [3, 9, 5], [0, 0, 0], [1, 1, 1]) or {"real_kv": short_kv()},
        S.REAL_KV_ROW_OUT_OF_RANGE,
        r"plan_buffers.verify_slot_indices\[1\] = 9 must be a slot whose real-KV page row",
        lambda s: sorted(r[1] for r in s.violations[:2].tolist()) == [3, 5],
    ),
    "verify real-KV page past a source, the next entry's predecessor": (
        # Entry 2's predecessor is entry 1's slot, whose record the kernel reuses from the
        # lane on its left: that lane skips its own check, not the record it loaded.
        "verify",
        lambda p: (
            set_verify_plan(p, [3, 9, 5, 6], [2, 8, 9, 5], [1, 1, 1, 1]) or {"real_kv": short_kv()}
        ),
        S.REAL_KV_ROW_OUT_OF_RANGE,
        r"plan_buffers.verify_slot_indices\[1\] = 9 must be a slot whose real-KV page row",
        lambda s: (
            sorted(r[1] for r in s.violations[:3].tolist()) == [3, 5, 6] and counters(s)[0] == 3
        ),
    ),
    "verify count past the capacity": (
        "verify",
        lambda p: set_verify_plan(p, [3] * 16, [0] * 16, [1] * 16, num_valid=18) or {},
        S.PLAN_COUNT_OUT_OF_RANGE,
        r"plan_buffers.verify_num_valid\[0\] = 18 must be in \[0, 16\]",
        lambda s: counters(s)[0] == 16 and counters(s)[2] == 16,
    ),
    "verify count negative": (
        "verify",
        lambda p: set_verify_plan(p, [3], [0], [1], num_valid=-3) or {},
        S.PLAN_COUNT_OUT_OF_RANGE,
        r"plan_buffers.verify_num_valid\[0\] = -3 must be in \[0, 16\]",
        lambda s: counters(s)[:3] == (0, 1, 0),
    ),
}


def setup(case):
    stage, make, bit, message, check = CASES[case]
    store = new_store(NUM_SLOTS, 32)
    plan = new_plan(write_req_capacity=4, verify_capacity=16)
    kwargs = make(plan)
    return stage, store, plan, {**kwargs, "launch_tag": 3}, bit, message, check


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_skip_the_entry_and_raise_the_bit(case):
    stage, store, plan, kwargs, bit, _message, check = setup(case)
    if stage == "write":
        model = model_write(model_state(store), plan, **kwargs)
    else:
        model = model_verify(model_state(store), plan, **kwargs)
    assert model.status == bit  # the model agrees with the case
    getattr(CANARY_PATHS["kernels"], stage)(store, plan, **kwargs)
    assert_store_matches_model(store, model)
    assert check(store)
    assert store.take_status() == bit
    assert int(store.status) == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_references_raise_and_write_nothing(case):
    stage, store, plan, kwargs, _bit, message, _check = setup(case)
    before, plan_before = snapshot_store(store), snapshot_plan(plan)
    with pytest.raises(ValueError, match="^kv-canary: " + message):
        getattr(CANARY_PATHS["reference"], stage)(store, plan, **kwargs)
    assert_store_equal(store, before)
    assert_plan_equal(plan, plan_before)


def test_status_bits_are_sticky_until_taken():
    store = new_store(NUM_SLOTS, 8)
    plan = new_plan(write_req_capacity=4, verify_capacity=16)
    launch_write = CANARY_PATHS["kernels"].write
    launch_verify = CANARY_PATHS["kernels"].verify
    # two bits in one launch: a bad seed in row 0, a bad slot in row 1
    set_write_plan(plan, [0, 1, 3], [NUM_SLOTS, -1])
    launch_write(store, plan, **write_inputs([3, 4, NUM_SLOTS + 1]))
    assert int(store.status) == S.SEED_OUT_OF_RANGE | S.WRITE_SLOT_OUT_OF_RANGE
    set_verify_plan(plan, [-1], [0], [0])
    launch_verify(store, plan)
    # a clean launch keeps the bits raised before it
    set_verify_plan(plan, [4], [-1], [1])
    launch_verify(store, plan)
    assert store.take_status() == (
        S.SEED_OUT_OF_RANGE | S.WRITE_SLOT_OUT_OF_RANGE | S.VERIFY_SLOT_OUT_OF_RANGE
    )
    launch_verify(store, plan)
    assert store.take_status() == S.OK
    assert counters(store)[1] == 4
