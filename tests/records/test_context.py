"""Hand cases of the project's own columns beside SGLang's (docs/contract-canary.md): the
owners sidecar the write stamps with each record, the context of every violation row
(``req_pool_index``, ``expected_position``, ``owner``), the verify's bisection over the
plan's ``verify_offsets``, ``verify_skipped`` and ``CanaryStatus.PADDING_SLOT_WRITTEN``, each
on both paths (``canary`` fixture). Expected values come from the contract's text."""

import pytest
import torch

from kv_canary_buffers import CanaryStatus, FailBits
from kv_canary_buffers.hashing import H0_SIGNED, mix3_int
from kv_canary_buffers.layout import INT64_MAX, INT64_MIN
from tests.helpers.canary import (
    JUNK,
    counters,
    i64,
    kept_rows,
    multiset,
    new_plan,
    new_store,
    set_verify_plan,
    set_verify_rows,
    set_write_plan,
    snapshot_store,
)

WT, WP = int(FailBits.WRITE_TOKEN), int(FailBits.WRITE_POSITION)
POS, CHAIN = int(FailBits.POSITION), int(FailBits.CHAIN)
PADDING = CanaryStatus.PADDING_SLOT_WRITTEN


def write(canary, store, plan, ids, pos, ocl, **kw):
    canary.write(store, plan, input_ids=i64(ids), positions=i64(pos), out_cache_loc=i64(ocl), **kw)


def assert_rows_with_context(canary, store, expected, start=0):
    """The ring holds ``expected`` (each row's eight columns, then its context's three)
    after ``start``: in order for the reference, as a multiset for the kernels."""
    got = kept_rows(store, start, context=True)
    if canary.name == "reference":
        assert got == [tuple(r) for r in expected]
    else:
        assert multiset(got) == multiset(expected)
    assert int(store.violation_count) == start + len(expected)


# --- the owners sidecar ------------------------------------------------------------------
def test_each_stamped_record_gets_its_rows_request_as_owner(canary):
    """Row r's request (row_req_pool_indices[r]) goes beside every record the row stamps;
    skipped tokens, idle rows and rows past the count stamp nothing; a request of any
    int64 value is stored as given; a slot written twice within a row keeps the row's."""
    store, plan = new_store(), new_plan(write_req_capacity=6)
    before = snapshot_store(store)
    # rows: 0 [0, 3) request 7; 1 idle (request 8); 2 [3, 5) request INT64_MIN;
    # 3 [5, 6) request INT64_MAX; 4 past the count (junk)
    set_write_plan(
        plan, [0, 3, 3, 5, 6, 7], [-1, 30, -1, -1], reqs=[7, 8, INT64_MIN, INT64_MAX], num_rows=4
    )
    write(
        canary, store, plan, [1, 2, 3, 4, 5, 6, 9], [0, 1, 2, 0, 1, 0, 0], [5, -1, 5, 9, 10, 11, 12]
    )
    want = before["owners"].clone()
    want[5], want[9], want[10], want[11] = 7, INT64_MIN, INT64_MIN, INT64_MAX
    assert store.owners.tolist() == want.tolist()
    assert store.records[12].tolist() == before["records"][12].tolist()  # past the count
    assert counters(store) == (0, 1, 5, 0)  # slot 5 twice: two records stamped


def test_an_owner_changes_with_the_next_writer_and_only_its_slots(canary):
    store, plan = new_store(), new_plan()
    set_write_plan(plan, [0, 2, 4], [-1, -1], reqs=[3, 4])
    write(canary, store, plan, [1, 2, 3, 4], [0, 1, 0, 1], [6, 7, 8, 9])
    assert store.owners[6:10].tolist() == [3, 3, 4, 4]
    set_write_plan(plan, [0, 1], [-1], reqs=[5])  # a later step hands slot 7 to request 5
    write(canary, store, plan, [9], [0], [7])
    assert store.owners[6:10].tolist() == [3, 5, 4, 4]


# --- the padding slot -------------------------------------------------------------------
def test_a_busy_row_writing_the_padding_slot_is_flagged_and_still_stamped(canary):
    """Slot 0 is in range: its record and owner are stamped as any slot's and the chain
    advances over it, and both paths raise PADDING_SLOT_WRITTEN (the reference too: a
    flag on valid data, not a refusal)."""
    store, plan = new_store(), new_plan()
    set_write_plan(plan, [0, 3], [-1], reqs=[6])
    write(canary, store, plan, [10, 11, 12], [0, 1, 2], [4, 0, 5])
    h1 = mix3_int(H0_SIGNED, 10, 0)
    assert store.records[0].tolist() == [11, 1, h1, 0]
    assert store.records[5].tolist() == [12, 2, mix3_int(h1, 11, 1), 0]
    assert store.owners[[4, 0, 5]].tolist() == [6, 6, 6]
    assert counters(store) == (0, 1, 3, int(PADDING))
    assert store.take_status() == PADDING
    # a skipped token (negative slot) or a row that writes elsewhere raises nothing
    write(canary, store, plan, [10, 11, 12], [0, 1, 2], [4, -1, 5])
    assert store.take_status() == CanaryStatus.OK


def test_padding_rows_of_a_plan_write_nothing_and_raise_nothing(canary):
    """A padding row (req_pool_indices 0) has no tokens in the plan: its slot-0 tokens
    are the engine's padding, outside every row's range, never read."""
    from kv_canary_buffers import plan_reference

    store, plan = new_store(num_slots=64), new_plan(write_req_capacity=3)
    table = torch.arange(1, 61, dtype=torch.int32).reshape(3, 20).to(store.device)
    plan_reference(
        plan,
        req_pool_indices=i64([1, 0, 2]),
        prefix_lens=i64([0, 5, 0]),
        extend_seq_lens=i64([2, 3, 1]),
        req_to_token=table,
    )
    assert plan.write_offsets[:4].tolist() == [0, 2, 2, 3]
    write(canary, store, plan, [1, 2, 3], [0, 1, 0], [21, 22, 41])
    assert store.owners[[21, 22, 41]].tolist() == [1, 1, 2]
    assert int(store.owners.count_nonzero()) == 3
    assert store.take_status() == CanaryStatus.OK


# --- the context of write rows -----------------------------------------------------------
def test_write_rows_carry_the_writing_rows_request_and_expected_position(canary):
    """Input check and chain-position check: the context is (the row's request, the
    position the row expected there, the row itself as the slot's writer)."""
    store, plan = new_store(), new_plan()
    store.records[3] = i64([1, 9, 5, 0])  # row 1's seed: position 9
    store.enable_chain_position_check()
    set_write_plan(plan, [0, 2, 4], [-1, 3], reqs=[11, 12])
    write(
        canary,
        store,
        plan,
        [20, 21, 30, 31],
        [0, 1, 10, 12],  # row 1: 10 follows 9, 12 does not follow 10
        [6, 7, 8, 9],
        launch_tag=4,
        expected_input_ids=i64([20, 99, 30, 31]),
        expected_positions=i64([0, 1, 10, 11]),
    )
    h_seed = mix3_int(5, 1, 9)
    h6 = mix3_int(H0_SIGNED, 20, 0)
    h8 = mix3_int(h_seed, 30, 10)
    assert_rows_with_context(
        canary,
        store,
        [
            (4, 7, 1, 21, 99, h6, 1, WT) + (11, 1, 11),
            (4, 9, 12, 31, 31, h8, 11, WP) + (12, 11, 12),  # expected_positions: 11
            (4, 9, 12, 31, 31, h8, 11, WP) + (12, 11, 12),  # the chain: 10 + 1
        ],
    )


# --- the context of verify rows ----------------------------------------------------------
def test_verify_rows_name_the_entrys_request_position_and_the_slots_owner(canary):
    """Three rows (one with no entries): each failing entry's request is its row's (found
    by bisection over verify_offsets), its expected position the entry's, its owner the
    slot's now (0: never written, stored as 0)."""
    store, plan = new_store(), new_plan(write_req_capacity=4)
    for s in (4, 5, 6, 7):
        store.records[s] = i64([s, 0, 0, 0])  # every record at position 0
    store.owners[4], store.owners[5], store.owners[6] = 21, 22, 23
    set_verify_plan(plan, [4, 5, 6, 7], [0, 0, 0, 0], [0, 1, 2, 3], tokens=[4, 5, 0, 7])
    set_verify_rows(plan, reqs=[31, 32, 33], counts=[1, 0, 3])
    canary.verify(store, plan, launch_tag=2)
    assert_rows_with_context(
        canary,
        store,
        [
            (2, 5, 0, 5, 5, 0, 0, POS) + (33, 1, 22),
            (2, 6, 0, 6, 0, 0, 0, POS | int(FailBits.VERIFY_TOKEN)) + (33, 2, 23),
            (2, 7, 0, 7, 7, 0, 0, POS) + (33, 3, 0),
        ],
    )
    report = store.take_violations()
    assert sorted(v.owner for v in report.violations) == [-1, 22, 23]  # 0 decodes as -1
    assert report.req_pool_indices() == (22, 23, 33)


REQS = [41, 42, 43, 44]
BISECTION_CASES = [
    # a plan's offsets: entry e's row is the last r < bs with offsets[r] <= e
    (4, [0, 2, 2, 5, 9], [41, 41, 43, 43, 43, 44]),
    (1, [0, 9, 0, 0, 0], [41] * 6),
    # a row count past the capacity is clamped to it; below 0 (or 0): no row, request 0
    (99, [0, 1, 2, 3, 4], [41, 42, 43, 44, 44, 44]),
    (0, [0, 1, 2, 3, 4], [0] * 6),
    (-5, [0, 1, 2, 3, 4], [0] * 6),
    # offsets that no plan writes: the bisection as written, every read in [0, bs)
    (4, [INT64_MAX, INT64_MIN, 7, -1, 0], [42] * 6),
    (4, [0, 3, 1, 2, 0], [41, 43, 44, 44, 44, 44]),
    (3, [5, 5, 5, 5, 5], [41, 41, 41, 41, 41, 43]),
]


@pytest.mark.parametrize(("num_rows", "offsets", "want"), BISECTION_CASES)
def test_the_entrys_row_is_the_contracts_bisection_on_any_offsets(canary, num_rows, offsets, want):
    store, plan = new_store(), new_plan(write_req_capacity=4)
    for s in range(1, 7):
        store.records[s] = i64([s, 100, 0, 0])  # position 100: every entry fails
    set_verify_plan(plan, [1, 2, 3, 4, 5, 6], [0] * 6, list(range(6)))
    plan.verify_offsets[:5] = i64(offsets)
    plan.row_req_pool_indices[:4] = i64(REQS)
    plan.write_num_valid_reqs.fill_(num_rows)
    canary.verify(store, plan)
    got = {r[1]: r[8] for r in kept_rows(store, context=True)}
    assert [got[s] for s in range(1, 7)] == want
    assert int(store.status) == 0  # the clamped count raises nothing in the verify


def _bisect(offsets, bs, entry):
    """The contract's request_of as its text states it (the row, not its request)."""
    lo, hi = 0, bs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= entry:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize(("num_rows", "offsets", "want"), BISECTION_CASES)
def test_the_bisection_cases_follow_the_contracts_text(num_rows, offsets, want):
    """The hand values above, recomputed from the contract's loop (a wrong hand value
    cannot hide a wrong path)."""
    bs = min(max(num_rows, 0), len(REQS))
    assert [REQS[_bisect(offsets, bs, e)] if bs else 0 for e in range(6)] == want


def test_a_full_ring_drops_the_context_with_its_row(canary):
    """Fill once: rows past the capacity write neither their row nor their context."""
    store, plan = new_store(violation_capacity=2), new_plan()
    store.violation_context.fill_(JUNK)
    for s in (4, 5, 6):
        store.records[s] = i64([s, 0, 0, 0])
    set_verify_plan(plan, [4, 5, 6], [0, 0, 0], [1, 1, 1])
    set_verify_rows(plan, reqs=[8], counts=[3])
    canary.verify(store, plan)
    assert int(store.violation_count) == 3
    ctx = store.violation_context.tolist()
    assert all(c[0] == 8 and c[1] == 1 for c in ctx)  # both kept rows have their context
    store.violation_count.fill_(2)  # full: the next rows are counted only
    canary.verify(store, plan)
    assert int(store.violation_count) == 5
    assert store.violation_context.tolist() == ctx


# --- verify_skipped -----------------------------------------------------------------------
@pytest.mark.parametrize("enable", [0, 1, 7])
def test_a_verify_of_a_plan_that_checks_nothing_is_counted(canary, enable):
    """verify_enable 0 (an overflowed or write-only plan): kernel_runs and verify_skipped
    +1, nothing else; any other value checks and is not counted."""
    store, plan = new_store(), new_plan()
    store.records[4] = i64([4, 0, 0, 0])
    set_verify_plan(plan, [4], [0], [1], enable=enable)
    for _ in range(2):
        canary.verify(store, plan)
    assert int(store.verify_skipped) == (2 if enable == 0 else 0)
    assert int(store.violation_count) == (0 if enable == 0 else 2)
    assert int(store.kernel_runs) == 2
    # never cleared by the library: not by take_violations, nor resize, and read by it
    report = store.take_violations()
    assert report.verify_skipped == int(store.verify_skipped)
    assert int(store.resize(num_slots=40).verify_skipped) == int(store.verify_skipped)


def test_the_write_never_counts_a_skip(canary):
    store, plan = new_store(), new_plan()
    set_write_plan(plan, [0, 1], [-1])
    plan.verify_enable.fill_(0)
    write(canary, store, plan, [1], [0], [3])
    assert int(store.verify_skipped) == 0 and int(store.kernel_runs) == 1


def test_a_verify_on_a_write_only_or_overflowed_plan_counts_one_skip(canary):
    """Issue 26 §2 and §4 end to end: a plan built with verify=False, and one whose
    entries overflow verify_capacity, check nothing; each verify of them says so."""
    from kv_canary_buffers import PlanStatus, plan_reference

    store = new_store(num_slots=64)
    table = torch.arange(1, 61, dtype=torch.int32).reshape(3, 20).to(store.device)
    batch = dict(
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([4, 3]),
        extend_seq_lens=i64([1, 1]),
        req_to_token=table,
    )
    plan = new_plan(write_req_capacity=2, verify_capacity=16)
    plan_reference(plan, **batch, verify=False)
    canary.verify(store, plan)
    assert (int(store.verify_skipped), int(store.violation_count)) == (1, 0)
    small = new_plan(write_req_capacity=2, verify_capacity=6)  # 7 entries: overflow
    plan_reference(small, **batch)
    assert small.take_status() == PlanStatus.VERIFY_OVERFLOW
    canary.verify(store, small)
    report = store.take_violations()
    assert (report.verify_skipped, report.appended, report.kernel_runs) == (2, 0, 2)
    assert "2 verify call(s) skipped (checked nothing)" in str(report)
    plan_reference(plan, **batch)  # verified: the junk records fail, nothing skipped
    canary.verify(store, plan)
    assert int(store.verify_skipped) == 2 and int(store.violation_count) == 7
