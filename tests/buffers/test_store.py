"""CanaryStore: allocation, sizes, growth, device flags, reading back, ownership of its
arena (tampering, copies, pickling), and the violation reports it returns."""

import copy
import itertools
import pickle

import attrs
import numpy as np
import pytest
import torch

from kv_canary_buffers import (
    CanaryStatus,
    CanaryStore,
    FailBits,
    Violation,
    ViolationReport,
    verify_reference,
    write_reference,
)
from kv_canary_buffers.arena import ALIGN
from kv_canary_buffers.devices import normalize_device
from kv_canary_buffers.layout import store_specs
from kv_canary_kernels import launch_verify, launch_write
from tests.helpers.canary import (
    DEVICE,
    STORE_FIELDS,
    assert_plan_equal,
    assert_store_equal,
    i64,
    new_plan,
    set_verify_plan,
    set_verify_rows,
    set_write_plan,
    snapshot_plan,
    snapshot_store,
)

I64, I32 = torch.int64, torch.int32


def filled_store(num_slots=8, violation_capacity=4):
    """A store whose every field holds distinct non-zero values."""
    store = CanaryStore.allocate(
        num_slots=num_slots, violation_capacity=violation_capacity, device=DEVICE
    )
    store.records.copy_(torch.arange(num_slots * 4, dtype=I64).reshape(num_slots, 4) + 1)
    store.violations.copy_(
        torch.arange(violation_capacity * 8, dtype=I64).reshape(violation_capacity, 8) + 500
    )
    store.violation_count.fill_(3)
    store.kernel_runs.fill_(11)
    store.slots_processed.fill_(12)
    store.chain_position_check.fill_(1)
    store.status.fill_(int(CanaryStatus.SEED_OUT_OF_RANGE | CanaryStatus.PREV_SLOT_OUT_OF_RANGE))
    store.owners.copy_(torch.arange(num_slots, dtype=I64) + 900)
    store.violation_context.copy_(
        torch.arange(violation_capacity * 3, dtype=I64).reshape(violation_capacity, 3) + 700
    )
    store.verify_skipped.fill_(13)
    return store


# --- allocation -------------------------------------------------------------------------
@pytest.mark.parametrize("num_slots, capacity", [(1, 1), (7, 3), (1000, 33)])
def test_allocate_shapes_dtypes_zeroed_and_bytes(num_slots, capacity):
    store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=capacity, device=DEVICE)
    assert store.num_slots == num_slots and store.violation_capacity == capacity
    assert store.generation == 0
    assert store.device == normalize_device(DEVICE)
    assert STORE_FIELDS == (
        "records",
        "violations",
        "violation_count",
        "kernel_runs",
        "slots_processed",
        "chain_position_check",
        "status",
        "owners",
        "violation_context",
        "verify_skipped",
    )
    want = {
        "records": (I64, (num_slots, 4)),
        "violations": (I64, (capacity, 8)),
        "violation_count": (I64, (1,)),
        "kernel_runs": (I64, (1,)),
        "slots_processed": (I64, (1,)),
        "chain_position_check": (I32, (1,)),
        "status": (I32, (1,)),
        "owners": (I64, (num_slots,)),
        "violation_context": (I64, (capacity, 3)),
        "verify_skipped": (I64, (1,)),
    }
    ptrs = []
    for name, (dtype, shape) in want.items():
        t = getattr(store, name)
        assert t.dtype == dtype and tuple(t.shape) == shape and t.is_contiguous(), name
        assert t.device == store.device
        assert (t == 0).all(), name
        assert (t.data_ptr() - store.arena.base) % ALIGN == 0
        ptrs.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    # one arena, fields in layout order, no overlap, every byte inside it
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ptrs))
    base = store.arena.base
    assert ptrs[0][0] == base and ptrs[-1][1] <= base + store.nbytes
    assert CanaryStore.allocation_bytes(num_slots, capacity) == store.nbytes
    minimum = 40 * num_slots + 88 * capacity + 8 * 4 + 4 * 2
    assert minimum <= store.nbytes <= minimum + ALIGN * len(want)
    assert [n for n, _d, _s in store_specs(num_slots, capacity)] == list(STORE_FIELDS)
    store.check()


@pytest.mark.parametrize("bad", [1.0, 2.5, True, False, "8", None, [8]])
@pytest.mark.parametrize("which", ["num_slots", "violation_capacity"])
def test_sizes_of_the_wrong_type_raise_type_error(bad, which):
    kwargs = dict(num_slots=4, violation_capacity=4)
    kwargs[which] = bad
    with pytest.raises(TypeError, match=f"^kv-canary: {which} must be an int"):
        CanaryStore.allocate(device=DEVICE, **kwargs)
    with pytest.raises(TypeError, match=f"^kv-canary: {which} must be an int"):
        CanaryStore.allocation_bytes(kwargs["num_slots"], kwargs["violation_capacity"])


@pytest.mark.parametrize("bad", [0, -1, 2**31, 2**63])
@pytest.mark.parametrize("which", ["num_slots", "violation_capacity"])
def test_sizes_out_of_range_raise_value_error(bad, which):
    kwargs = dict(num_slots=4, violation_capacity=4)
    kwargs[which] = bad
    with pytest.raises(ValueError, match=rf"^kv-canary: {which} must be in \[1, 2147483647\]"):
        CanaryStore.allocate(device=DEVICE, **kwargs)
    with pytest.raises(ValueError, match=f"^kv-canary: {which}"):
        CanaryStore.allocation_bytes(kwargs["num_slots"], kwargs["violation_capacity"])


def test_numpy_integer_sizes_are_accepted():
    store = CanaryStore.allocate(
        num_slots=np.int64(5), violation_capacity=np.int32(2), device=DEVICE
    )
    assert (store.num_slots, store.violation_capacity) == (5, 2)
    assert type(store.num_slots) is int
    assert CanaryStore.allocation_bytes(np.int16(5), np.uint8(2)) == store.nbytes


# --- growth -------------------------------------------------------------------------------
@pytest.mark.parametrize("num_slots, capacity", [(12, 6), (5, 2), (8, None), (None, 9)])
def test_resize_copies_state_and_leaves_the_old_store_valid(num_slots, capacity):
    old = filled_store(8, 4)
    before = snapshot_store(old)
    new = old.resize(num_slots=num_slots, violation_capacity=capacity)
    n = 8 if num_slots is None else num_slots
    v = 4 if capacity is None else capacity
    assert (new.num_slots, new.violation_capacity, new.generation) == (n, v, 1)
    k, j = min(n, 8), min(v, 4)
    per_slot, per_row = ("records", "owners"), ("violations", "violation_context")
    for name in per_slot:  # every old slot's record and owner
        assert torch.equal(getattr(new, name)[:k], before[name][:k]), name
        assert (getattr(new, name)[k:] == 0).all(), name
    for name in per_row:  # the ring rows that fit, each with its context
        assert torch.equal(getattr(new, name)[:j], before[name][:j]), name
        assert (getattr(new, name)[j:] == 0).all(), name
    for name in set(STORE_FIELDS) - set(per_slot) - set(per_row):
        assert torch.equal(getattr(new, name), before[name]), name
    assert new.arena is not old.arena
    assert new.records.data_ptr() != old.records.data_ptr()
    new.check()
    old.check()
    assert_store_equal(old, before)
    new.records.fill_(-1)
    new.status.fill_(0)
    assert_store_equal(old, before)  # independent
    assert old.resize().generation == 1 and new.resize().generation == 2


def test_ensure_capacity():
    store = filled_store(8, 4)
    assert store.ensure_capacity(num_slots=8) is store
    assert store.ensure_capacity(num_slots=0) is store
    assert store.ensure_capacity() is store
    grown = store.ensure_capacity(num_slots=np.int64(13))
    assert grown is not store
    assert (grown.num_slots, grown.violation_capacity, grown.generation) == (13, 4, 1)
    assert torch.equal(grown.records[:8], store.records)
    with pytest.raises(ValueError, match=r"^kv-canary: num_slots must be >= 0"):
        store.ensure_capacity(num_slots=-1)
    with pytest.raises(TypeError, match=r"^kv-canary: num_slots must be an int"):
        store.ensure_capacity(num_slots=9.0)
    with pytest.raises(ValueError, match=r"^kv-canary: num_slots must be <= 2147483647 \(the"):
        store.ensure_capacity(num_slots=2**31)


# --- device flags and reading back ----------------------------------------------------------
def test_chain_position_check_flips_in_place():
    store = CanaryStore.allocate(num_slots=4, violation_capacity=1, device=DEVICE)
    flag = store.chain_position_check
    ptr = flag.data_ptr()
    store.enable_chain_position_check()
    assert store.chain_position_check.data_ptr() == ptr
    assert flag.tolist() == [1]
    store.enable_chain_position_check()
    assert flag.tolist() == [1]
    store.disable_chain_position_check()
    assert flag.tolist() == [0] and flag.data_ptr() == ptr
    store.check()


def test_take_status_reports_and_clears():
    store = CanaryStore.allocate(num_slots=4, violation_capacity=1, device=DEVICE)
    assert store.take_status() == CanaryStatus.OK
    bits = CanaryStatus.WRITE_SLOT_OUT_OF_RANGE | CanaryStatus.PLAN_COUNT_OUT_OF_RANGE
    store.status.fill_(int(bits) | (1 << 20))  # an unknown bit is not reported
    got = store.take_status()
    assert got == bits and isinstance(got, CanaryStatus)
    assert int(store.status) == 0
    assert store.take_status() == CanaryStatus.OK


def test_take_violations_decodes_and_clears_only_the_ring():
    store = CanaryStore.allocate(num_slots=4, violation_capacity=3, device=DEVICE)
    rows = [[1, 2, 3, 4, 5, 6, 7, int(FailBits.CHAIN)], [-1, 3, 0, 9, -1, -5, 2**62, 0b111111]]
    context = [[4, 5, 6], [-2, 2**62, 0]]
    store.violations[:2] = i64(rows)
    store.violations[2] = 77  # past the count: not a row
    store.violation_context[:2] = i64(context)
    store.violation_context[2] = 78
    store.violation_count.fill_(2)
    store.kernel_runs.fill_(5)
    store.slots_processed.fill_(6)
    store.verify_skipped.fill_(4)
    store.owners.fill_(3)
    report = store.take_violations()
    assert (report.appended, report.dropped, report.kernel_runs, report.slots_processed) == (
        2,
        0,
        5,
        6,
    )
    assert report.verify_skipped == 4
    assert report.violations == tuple(
        Violation.from_row(r, context=c) for r, c in zip(rows, context)
    )
    first, second = report.violations
    assert (first.req_pool_index, first.expected_position, first.owner) == (4, 5, 6)
    assert (second.req_pool_index, second.expected_position, second.owner) == (-2, 2**62, -1)
    assert report.violations[1].fail_bits == FailBits(63)
    assert store.violations[:2].eq(0).all() and store.violations[2].eq(77).all()
    assert store.violation_context[:2].eq(0).all() and store.violation_context[2].eq(78).all()
    assert int(store.violation_count) == 0
    assert (int(store.kernel_runs), int(store.slots_processed)) == (5, 6)
    assert int(store.verify_skipped) == 4 and store.owners.eq(3).all()  # never cleared
    again = store.take_violations()
    assert not again and again.appended == 0 and again.violations == ()
    assert again.kernel_runs == 5


def test_take_violations_with_dropped_rows():
    store = CanaryStore.allocate(num_slots=4, violation_capacity=2, device=DEVICE)
    store.violations.fill_(4)
    store.violation_count.fill_(7)
    report = store.take_violations()
    assert (report.appended, report.dropped, len(report.violations)) == (7, 5, 2)
    assert bool(report)
    assert (store.violations == 0).all() and int(store.violation_count) == 0


# --- tampering ----------------------------------------------------------------------------
# The public fields are FieldAlias reads (a new alias of a private view at each read,
# assignment and deletion refused): the tamperings below reach past them to the private
# views, or resize the shared storage, and are refused wherever the store is used.
def _swap_attr(store):
    object.__setattr__(store, "_records", torch.zeros_like(store.records))
    return "records"


def _swap_data(store):
    store._violations.data = torch.zeros_like(store.violations)
    return "violations"


def _swap_set(store):
    store._kernel_runs.set_(torch.zeros(1, dtype=I64, device=DEVICE))
    return "kernel_runs"


def _swap_dtype(store):
    object.__setattr__(store, "_status", store.status.view(torch.float32))
    return "status"


def _swap_shape(store):
    object.__setattr__(store, "_violations", store.violations[:1])
    return "violations"


def _swap_not_tensor(store):
    object.__setattr__(store, "_chain_position_check", [0])
    return "chain_position_check"


def _resize_storage(store):
    store.records.untyped_storage().resize_(0)
    return "its arena's storage"


def _delete(store):
    object.__delattr__(store, "_slots_processed")
    return "missing a field"


def _arena_rebound(name, value):
    """The arena's own attribute ``name`` rebound behind its frozen guard (issue 26 §7:
    a larger ``fields`` had the kernels store past each field, the references raise raw
    errors after writing part of a step, junk types raw TypeErrors)."""

    def tamper(store):
        object.__setattr__(store.arena, name, value(store) if callable(value) else value)
        return f"CanaryStore.arena.{name} must be the object the arena was built with"

    return tamper


def _grown_fields(store):
    from kv_canary_buffers.arena import layout
    from kv_canary_buffers.layout import store_specs

    return layout(store_specs(64, 16))[0]  # the layout of a larger store: same names


ARENA_TAMPERS = {
    "arena.fields grown": _arena_rebound("fields", _grown_fields),
    "arena.fields equal copy": _arena_rebound("fields", lambda s: (*s.arena.fields,)),
    "arena.fields junk": _arena_rebound("fields", "junk"),
    "arena.fields None": _arena_rebound("fields", None),
    "arena.device": _arena_rebound("device", torch.device("meta")),
    "arena.on_device": _arena_rebound("on_device", lambda s: lambda t: True),
    "arena.address": _arena_rebound("address", {}),
    "arena.launches": _arena_rebound("launches", 7),
    "arena.handle": _arena_rebound("handle", 10**9),
}


TAMPERS = {
    **ARENA_TAMPERS,
    "setattr": _swap_attr,
    "data": _swap_data,
    "set_": _swap_set,
    "dtype": _swap_dtype,
    "shape": _swap_shape,
    "not a tensor": _swap_not_tensor,
    "storage resized": _resize_storage,
    "deleted": _delete,
}


def _write(fn, store, plan):
    fn(store, plan, input_ids=i64([1, 2]), positions=i64([0, 1]), out_cache_loc=i64([1, 2]))


def _verify(fn, store, plan):
    fn(store, plan)


CALLS = {
    "write_reference": lambda s, p: _write(write_reference, s, p),
    "launch_write": lambda s, p: _write(launch_write, s, p),
    "verify_reference": lambda s, p: _verify(verify_reference, s, p),
    "launch_verify": lambda s, p: _verify(launch_verify, s, p),
    "check": lambda s, p: s.check(views=True),
    "take_violations": lambda s, p: s.take_violations(),
    "take_status": lambda s, p: s.take_status(),
    "resize": lambda s, p: s.resize(num_slots=9),
    "deepcopy": lambda s, p: copy.deepcopy(s),
    "pickle": lambda s, p: pickle.dumps(s),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_tampered_store_is_refused_and_nothing_is_written(tamper, call):
    store = CanaryStore.allocate(num_slots=4, violation_capacity=2, device=DEVICE)
    plan = new_plan()
    set_write_plan(plan, [0, 2], [-1])
    set_verify_plan(plan, [1, 2], [-1, 1], [5, 5])  # would append rows
    store.violation_count.fill_(1)  # take_violations would clear it
    store.status.fill_(1)  # take_status would clear it
    arena = torch.empty(0, dtype=torch.uint8, device=DEVICE).set_(
        store.arena.storage, 0, (store.nbytes,)
    )
    arena_before = arena.clone()
    plan_before = snapshot_plan(plan)
    resized = tamper == "storage resized"
    what = TAMPERS[tamper](store)
    swapped = (
        {}
        if resized
        else {  # after a resize the views point at freed memory
            name: (t, t.clone())
            for name in STORE_FIELDS
            for t in (getattr(store, name, None),)
            if isinstance(t, torch.Tensor)
        }
    )
    error = AttributeError if tamper == "deleted" else ValueError
    with pytest.raises(error, match=r"^kv-canary: ") as info:
        CALLS[call](store, plan)
    assert what in str(info.value)
    assert_plan_equal(plan, plan_before)
    if resized:
        return  # nothing of the store can be read back
    assert torch.equal(arena, arena_before), "the arena was written"
    for name, (t, old) in swapped.items():
        assert torch.equal(t, old), f"{name} (as tampered) was written"


@pytest.mark.parametrize("name", STORE_FIELDS)
def test_a_store_field_cannot_be_assigned_or_deleted(name):
    store = CanaryStore.allocate(num_slots=4, violation_capacity=2, device=DEVICE)
    prefix = rf"^kv-canary: CanaryStore\.{name} cannot be"
    with pytest.raises(AttributeError, match=prefix + " assigned"):
        object.__setattr__(store, name, torch.zeros(1))
    with pytest.raises(AttributeError, match=prefix + " deleted"):
        object.__delattr__(store, name)
    store.check(views=True)


def test_a_read_store_field_changed_in_place_leaves_the_store_intact():
    """``.data =``, ``set_`` and shape changes of a tensor read from a field change that
    alias only; a write and a verify on the store then equal those on a fresh store."""
    store, fresh = (
        CanaryStore.allocate(num_slots=4, violation_capacity=2, device=DEVICE) for _ in range(2)
    )
    records = store.records
    records.data = torch.zeros(1, dtype=I64, device=DEVICE)
    store.violations.set_(torch.zeros(3, dtype=I64, device=DEVICE))
    store.status.as_strided_((1, 1), (1, 1))
    assert store.records.shape == (4, 4) and store.violations.shape == (2, 8)
    store.check(views=True)
    plan = new_plan()
    set_write_plan(plan, [0, 2], [-1])
    for s in (store, fresh):
        _write(write_reference, s, plan)
    assert torch.equal(store.records, fresh.records)
    assert int(store.kernel_runs) == int(fresh.kernel_runs) == 1


# --- copies and pickling ------------------------------------------------------------------
def test_shallow_copy_and_evolve_are_refused():
    store = filled_store()
    with pytest.raises(TypeError, match=r"^kv-canary: a CanaryStore cannot be shallow-copied"):
        copy.copy(store)
    with pytest.raises(ValueError, match=r"^kv-canary: this arena already belongs to a live"):
        attrs.evolve(store)
    with pytest.raises(ValueError, match=r"^kv-canary: this arena already belongs to a live"):
        attrs.evolve(store, generation=5)
    fields = {name: getattr(store, name) for name in STORE_FIELDS}
    with pytest.raises(ValueError, match=r"^kv-canary: this arena already belongs to a live"):
        CanaryStore(arena=store.arena, **fields)
    with pytest.raises(TypeError, match=r"^kv-canary: CanaryStore\.arena must be an Arena"):
        CanaryStore(arena=object(), **fields)
    with pytest.raises(ValueError, match=r"^kv-canary: generation must be >= 0"):
        CanaryStore(arena=store.arena, generation=-1, **fields)
    store.check()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        store.records = torch.zeros_like(store.records)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_give_an_independent_equal_store(how):
    store = filled_store(6, 3)
    object.__setattr__(store, "generation", 4)
    before = snapshot_store(store)
    if how == "deepcopy":
        twin = copy.deepcopy(store)
        inside = copy.deepcopy([store, store])
        assert inside[0] is inside[1] and inside[0] is not store
    else:
        twin = pickle.loads(pickle.dumps(store))
    assert type(twin) is CanaryStore
    assert (twin.num_slots, twin.violation_capacity, twin.generation) == (6, 3, 4)
    assert twin.device == store.device
    assert twin.arena is not store.arena
    assert_store_equal(twin, before)
    twin.check()
    for name in STORE_FIELDS:
        assert getattr(twin, name).data_ptr() != getattr(store, name).data_ptr()
        getattr(twin, name).fill_(-3)
    assert_store_equal(store, before)
    # the copy is a store in its own right: it is written like one
    plan = new_plan()
    set_write_plan(plan, [0, 1], [-1])
    write_reference(twin, plan, input_ids=i64([5]), positions=i64([0]), out_cache_loc=i64([2]))
    assert twin.records[2, 0].item() == 5
    assert_store_equal(store, before)


# --- reports --------------------------------------------------------------------------------
def test_violation_from_row_decodes():
    v = Violation.from_row([7, 12, 3, 40, 41, -2, 2**63 - 1, (1 << 40) | 0b100011])
    assert (v.launch_tag, v.slot, v.position, v.stored_token, v.expected_token) == (
        7,
        12,
        3,
        40,
        41,
    )
    assert (v.stored_chain_hash, v.expected_aux) == (-2, 2**63 - 1)
    assert v.fail_bits == FailBits.CHAIN | FailBits.POSITION | FailBits.VERIFY_TOKEN
    assert isinstance(v.fail_bits, FailBits)
    assert not v.is_write
    w = Violation.from_row(i64([0, 1, 2, 3, 4, 5, 6, int(FailBits.WRITE_POSITION)], "cpu"))
    assert w.is_write and w.expected_aux == 6 and type(w.slot) is int
    assert Violation.from_row([0] * 7 + [int(FailBits.WRITE_TOKEN)]).is_write
    # no context (SGLang's ring, a store saved before version 2): a zeroed one
    assert (v.req_pool_index, v.expected_position, v.owner) == (0, 0, -1)


@pytest.mark.parametrize(
    ("context", "want"),
    [
        ([3, 17, 5], (3, 17, 5)),
        ([3, 17, 0], (3, 17, -1)),  # the slot never written by the canary: unknown owner
        ([0, -(2**63), -1], (0, -(2**63), -1)),  # -1 stored stays -1
        (i64([2**63 - 1, 4, 2**62], "cpu"), (2**63 - 1, 4, 2**62)),
    ],
)
def test_violation_from_row_decodes_its_context(context, want):
    v = Violation.from_row([1, 2, 3, 4, 5, 6, 7, int(FailBits.POSITION)], context=context)
    assert (v.req_pool_index, v.expected_position, v.owner) == want
    assert all(type(x) is int for x in want)
    assert v.to_dict()["owner"] == want[2] and Violation.from_dict(v.to_dict()) == v


def test_violation_str_names_the_request_and_the_owner():
    verify = Violation.from_row([1, 9, 4, 7, 7, 0, 0, int(FailBits.POSITION)], context=[2, 5, 3])
    text = str(verify)
    assert "slot 9 position 4" in text
    assert "request 2 expected position 5, slot last written by request 3" in text
    unknown = Violation.from_row([1, 9, 4, 7, 7, 0, 0, int(FailBits.CHAIN)], context=[2, 5, 0])
    assert str(unknown).endswith("slot last written by request unknown")
    write = Violation.from_row([1, 9, 4, 7, 8, 0, 5, int(FailBits.WRITE_TOKEN)], context=[6, 5, 6])
    assert str(write).endswith("expected position 5; written by request 6")


def test_report_req_pool_indices_are_victims_and_culprits_sorted_unique_never_zero():
    def row(bits, context):
        return Violation.from_row([0, 1, 0, 0, 0, 0, 0, int(bits)], context=context)

    report = ViolationReport(
        violations=(
            row(FailBits.POSITION, [5, 0, 9]),  # victim 5, culprit 9
            row(FailBits.CHAIN, [5, 1, 9]),
            row(FailBits.POSITION, [2, 0, 0]),  # owner unknown
            row(FailBits.POSITION, [0, 0, 3]),  # no request known, culprit 3
            row(FailBits.WRITE_POSITION, [7, 2, 7]),  # a write row: the writer
        ),
        appended=5,
        dropped=0,
        kernel_runs=1,
        slots_processed=1,
    )
    assert report.req_pool_indices() == (2, 3, 5, 7, 9)
    assert "requests 2, 3, 5, 7, 9" in str(report).splitlines()[0]
    empty = ViolationReport(violations=(), appended=0, dropped=0, kernel_runs=0, slots_processed=0)
    assert empty.req_pool_indices() == ()


def test_report_str_counts_skipped_verifies():
    report = ViolationReport(
        violations=(), appended=0, dropped=0, kernel_runs=3, slots_processed=9, verify_skipped=2
    )
    assert str(report) == (
        "kv-canary: no violations; 3 kernel runs, 9 slots processed, 2 verify call(s) skipped "
        "(checked nothing)"
    )


def test_report_str_without_violations():
    report = ViolationReport(violations=(), appended=0, dropped=0, kernel_runs=3, slots_processed=9)
    assert str(report) == "kv-canary: no violations; 3 kernel runs, 9 slots processed"
    assert not report and report.count_by_bits() == {}


def test_report_str_lists_rows_with_slots_and_bit_names():
    rows = [
        [5, 17, 4, 100, 101, -1, 2**63 - 1, int(FailBits.CHAIN | FailBits.VERIFY_TOKEN)],
        [5, 18, 9, 7, 8, 3, 10, int(FailBits.WRITE_TOKEN | FailBits.WRITE_POSITION)],
    ]
    report = ViolationReport(
        violations=tuple(Violation.from_row(r) for r in rows),
        appended=2,
        dropped=0,
        kernel_runs=4,
        slots_processed=12,
    )
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == "kv-canary: 2 violation(s); 4 kernel runs, 12 slots processed"
    assert "[CHAIN|VERIFY_TOKEN]" in lines[1] and "slot 17" in lines[1]
    assert "position 4" in lines[1] and "token 100 (expected 101)" in lines[1]
    assert "chain 0xffffffffffffffff" in lines[1]  # hashes shown unsigned
    assert "expected chain 0x7fffffffffffffff" in lines[1]
    assert "[WRITE_TOKEN|WRITE_POSITION]" in lines[2] and "slot 18" in lines[2]
    assert "expected position 10" in lines[2]
    assert report.count_by_bits() == {
        FailBits.CHAIN: 1,
        FailBits.VERIFY_TOKEN: 1,
        FailBits.WRITE_TOKEN: 1,
        FailBits.WRITE_POSITION: 1,
    }


def test_report_str_with_dropped_rows_and_many_rows():
    rows = [[0, s, 0, 0, 0, 0, 0, int(FailBits.REAL_KV)] for s in range(25)]
    report = ViolationReport(
        violations=tuple(Violation.from_row(r) for r in rows),
        appended=30,
        dropped=5,
        kernel_runs=1,
        slots_processed=30,
    )
    lines = str(report).splitlines()
    assert lines[0] == (
        "kv-canary: 30 violation(s), 5 dropped (ring full); 1 kernel runs, 30 slots processed"
    )
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  ... 5 more"
    assert all("[REAL_KV]" in line for line in lines[1:21])
    assert "slot 19 " in lines[20]


def test_report_from_a_real_verify_names_slot_bits_request_and_owner():
    store = CanaryStore.allocate(num_slots=8, violation_capacity=1, device=DEVICE)
    store.owners[3] = 6  # slot 3 last written by request 6
    plan = new_plan()
    set_verify_plan(plan, [3, 4], [0, 0], [2, 2])
    set_verify_rows(plan, [4], [2])  # one row, request 4, both entries
    verify_reference(store, plan, launch_tag=42)
    report = store.take_violations()
    assert (report.appended, report.dropped) == (2, 1)
    text = str(report)
    assert "1 dropped (ring full)" in text
    assert "[POSITION] tag 42 slot 3 position 0" in text
    assert "request 4 expected position 2, slot last written by request 6" in text
    assert report.req_pool_indices() == (4, 6)


def test_sizes_given_as_tensors_are_refused_with_the_reason():
    import torch

    from kv_canary_buffers import CanaryStore

    with pytest.raises(TypeError, match=r"kv-canary: num_slots must be an int, got Tensor.*sync"):
        CanaryStore.allocate(num_slots=torch.tensor(8), violation_capacity=4, device="cpu")


def test_repr_names_sizes_device_and_generation():
    from kv_canary_buffers import CanaryStore

    store = CanaryStore.allocate(num_slots=10, violation_capacity=4, device="cpu")
    text = repr(store.resize(num_slots=12))
    assert text == (
        "CanaryStore(num_slots=12, violation_capacity=4, device=device(type='cpu'), generation=1)"
    )


def test_a_store_rebound_onto_another_stores_arena_is_refused():
    from kv_canary_buffers import CanaryStore

    a = CanaryStore.allocate(num_slots=8, violation_capacity=2, device="cpu")
    b = CanaryStore.allocate(num_slots=8, violation_capacity=2, device="cpu")
    for name in (
        "arena",
        "_records",
        "_violations",
        "_violation_count",
        "_kernel_runs",
        "_slots_processed",
        "_chain_position_check",
        "_status",
    ):
        object.__setattr__(b, name, getattr(a, name))
    with pytest.raises(ValueError, match="kv-canary: this CanaryStore does not own its arena"):
        b.check()
    a.check()  # the owner is unaffected
