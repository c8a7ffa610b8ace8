"""``launch_write_pair`` (a step's HEAD and TAIL writes in one launch) against two
``write_reference`` calls and against ``write_pair_reference``, byte for byte, on
generated stores, plans, inputs and real-KV sources (violation rows as multisets: the
kernels' order within a store is unspecified); and its refusals, which write neither
store."""

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_canary_buffers import RealKV, RealKVMode, write_pair_reference, write_reference
from kv_canary_kernels import launch_write, launch_write_pair
from kv_canary_kernels.config import launch_config
from tests.helpers.canary import (
    DEVICE,
    assert_store_equal,
    counters,
    kept_rows,
    new_store,
    snapshot_store,
)
from tests.records.test_property import (
    SETTINGS,
    gen_real_kv,
    gen_store,
    gen_write,
    new_plan,
)

_PLAIN = ("input_ids", "positions", "out_cache_loc", "real_kv")


def _same(a, b) -> None:
    assert torch.equal(a.records, b.records)
    assert torch.equal(a.owners, b.owners)
    assert counters(a) == counters(b)
    assert torch.equal(a.chain_position_check, b.chain_position_check)
    if int(a.violation_count) <= a.violation_capacity:
        assert sorted(kept_rows(a, context=True)) == sorted(kept_rows(b, context=True))
    else:  # (a full ring keeps some of the rows, which ones is unspecified)
        assert int(a.violation_count) == int(b.violation_count)


@settings(max_examples=25, **SETTINGS)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_slots=st.integers(1, 48),
    write_cap=st.sampled_from([1, 3, 8, 37]),
    chain_tokens=st.sampled_from([0, 2, 16]),
    expected=st.booleans(),
)
def test_the_pair_equals_the_two_writes(seed, num_slots, write_cap, chain_tokens, expected):
    rng = random.Random(seed)
    head = gen_store(rng, num_slots, rng.choice([1, 5, 16]))
    tail = gen_store(rng, num_slots, rng.choice([1, 5, 16]))  # its own records, ring, flag
    plan = new_plan(write_cap, 4)
    real_kv = gen_real_kv(rng, num_slots)
    kwargs = gen_write(rng, head, plan, hostile=False)
    if not expected:
        kwargs.pop("expected_input_ids", None)
        kwargs.pop("expected_positions", None)
    kwargs.update(real_kv=real_kv, launch_tag=rng.randrange(-(2**63), 2**63))
    tail_tag = rng.randrange(-(2**63), 2**63)
    plain = {k: kwargs[k] for k in _PLAIN}
    ref = (copy.deepcopy(head), copy.deepcopy(tail))
    pair_ref = (copy.deepcopy(head), copy.deepcopy(tail))
    write_reference(ref[0], plan, **kwargs)
    write_reference(ref[1], plan, launch_tag=tail_tag, **plain)
    write_pair_reference(*pair_ref, plan, tail_launch_tag=tail_tag, **kwargs)
    with launch_config(write_chain_tokens=chain_tokens):
        launch_write_pair(head, tail, plan, tail_launch_tag=tail_tag, **kwargs)
    for got, want, again in zip((head, tail), ref, pair_ref):
        _same(got, want)
        _same(again, want)
        assert sorted(kept_rows(again, context=True)) == sorted(kept_rows(want, context=True))


@settings(max_examples=20, **SETTINGS)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.tuples(st.integers(1, 48), st.integers(1, 48)),
    write_cap=st.sampled_from([1, 3, 8, 37]),
    chain_tokens=st.sampled_from([0, 2, 16]),
    expected=st.booleans(),
)
def test_the_pair_equals_two_launches_on_stores_of_their_own_sizes(
    seed, sizes, write_cap, chain_tokens, expected
):
    # the tail's num_slots and ring differ from the head's: each half bounds its slots by
    # its own store (a slot past the smaller store is skipped and flagged there alone),
    # as two launch_write calls do (the references raise on such data: kernels only)
    rng = random.Random(seed)
    head = gen_store(rng, sizes[0], rng.choice([1, 5, 16]))
    tail = gen_store(rng, sizes[1], rng.choice([1, 5, 16]))
    plan = new_plan(write_cap, 4)
    real_kv = gen_real_kv(rng, max(sizes))  # (covering both stores)
    kwargs = gen_write(rng, head if sizes[0] >= sizes[1] else tail, plan, hostile=False)
    if not expected:
        kwargs.pop("expected_input_ids", None)
        kwargs.pop("expected_positions", None)
    kwargs.update(real_kv=real_kv, launch_tag=5)
    plain = {k: kwargs[k] for k in _PLAIN}
    two = (copy.deepcopy(head), copy.deepcopy(tail))
    with launch_config(write_chain_tokens=chain_tokens):  # (0, 2: rows to the chain programs)
        launch_write(two[0], plan, **kwargs)
        launch_write(two[1], plan, launch_tag=9, **plain)
        launch_write_pair(head, tail, plan, tail_launch_tag=9, **kwargs)
    for got, want in zip((head, tail), two):
        _same(got, want)
        assert torch.equal(got.status, want.status)


def _step(plan, store):
    """A decode step of two rows writing slots 5 and 9 (the contract's hand case shape)."""
    from tests.helpers.canary import i64, set_write_plan

    set_write_plan(plan, offsets=[0, 1, 2], seeds=[-1, -1], reqs=[3, 4])
    return dict(
        input_ids=i64([11, 12]),
        positions=i64([0, 0]),
        out_cache_loc=i64([5, 9]),
        expected_input_ids=i64([11, 13]),  # the second token differs: a HEAD violation
        expected_positions=i64([0, 0]),
        launch_tag=7,
    )


def test_the_expected_inputs_are_the_heads_only():
    head, tail = new_store(), new_store()
    plan = new_plan()
    kwargs = _step(plan, head)
    launch_write_pair(head, tail, plan, tail_launch_tag=8, **kwargs)
    assert int(head.violation_count) == 1 and int(tail.violation_count) == 0
    assert int(head.violations[0, 0]) == 7  # the head's tag (the row's first column)
    for store in (head, tail):
        assert store.records[5, 0] == 11 and store.records[9, 0] == 12
        assert int(store.kernel_runs) == 1 and int(store.slots_processed) == 2


@pytest.mark.parametrize("path", [launch_write_pair, write_pair_reference])
def test_a_refused_pair_writes_neither_store(path):
    head, tail = new_store(), new_store()
    plan = new_plan()
    kwargs = _step(plan, head)
    before = (snapshot_store(head), snapshot_store(tail))
    with pytest.raises(ValueError, match="kv-canary: tail must be another CanaryStore than head"):
        path(head, head, plan, **kwargs)
    with pytest.raises(TypeError, match="kv-canary: tail: store must be"):
        path(head, object(), plan, **kwargs)
    with pytest.raises(TypeError, match="kv-canary: head: store must be"):
        path(object(), tail, plan, **kwargs)
    small = RealKV(  # covers the head's slots, not a larger tail's
        mode=RealKVMode.PARTIAL,
        sources=(torch.zeros(4, 64, dtype=torch.float16, device=DEVICE),),
        page_size=8,
        bytes_per_token=16,
    )
    big_tail = new_store(num_slots=64)
    with pytest.raises(ValueError, match=r"kv-canary: tail: real_kv\.sources"):
        path(head, big_tail, plan, **{**kwargs, "real_kv": small})
    before_big = snapshot_store(big_tail)
    inside = tail.records.view(-1)[:2]  # an expected input inside the tail's arena
    with pytest.raises(ValueError, match="expected_input_ids must not share memory"):
        path(head, tail, plan, **{**kwargs, "expected_input_ids": inside})
    with pytest.raises(ValueError, match="kv-canary: tail_launch_tag must be"):
        path(head, tail, plan, tail_launch_tag=2**63, **kwargs)
    assert_store_equal(head, before[0])
    assert_store_equal(tail, before[1])
    assert_store_equal(big_tail, before_big)


def test_the_references_pair_checks_both_stores_data_before_writing_either():
    # a slot inside the head's store but past the tail's: the reference refuses (as
    # write_reference does on such data) and writes neither store
    head, tail = new_store(num_slots=32), new_store(num_slots=8)
    plan = new_plan()
    kwargs = _step(plan, head)
    kwargs["out_cache_loc"] = kwargs["out_cache_loc"] + 10  # slots 15 and 19
    before = (snapshot_store(head), snapshot_store(tail))
    with pytest.raises(ValueError, match=r"^kv-canary: out_cache_loc"):
        write_pair_reference(head, tail, plan, **kwargs)
    assert_store_equal(head, before[0])
    assert_store_equal(tail, before[1])
