"""Hand cases of the canary contract (canary-contract.md), each on both paths: the torch
references and the Triton launchers (``canary`` fixture). Expected values come from the
contract's text and the plain-Python hashes, never from either path."""

import pytest
import torch

from kv_canary_buffers import FailBits, RealKV, RealKVMode, plan_reference
from kv_canary_buffers.hashing import H0_SIGNED, mix3, mix3_int, sm, sm_int, to_signed
from kv_canary_buffers.layout import ANCHOR_SEED, H0, INT64_MAX, INT64_MIN
from tests.helpers.canary import (
    DEVICE,
    JUNK,
    counters,
    hash_of,
    i64,
    is_sub_multiset,
    kept_rows,
    make_source,
    multiset,
    new_plan,
    new_store,
    py_real_kv,
    set_verify_plan,
    set_write_plan,
    slot_bytes,
    snapshot_store,
)

WT, WP = int(FailBits.WRITE_TOKEN), int(FailBits.WRITE_POSITION)
CHAIN, POS, KV, VT = (
    int(FailBits.CHAIN),
    int(FailBits.POSITION),
    int(FailBits.REAL_KV),
    int(FailBits.VERIFY_TOKEN),
)
MIX_H0_10_0 = to_signed(0xCD6D3FC64AB68B75)
MIX_H0_M1_5 = to_signed(0xA655CDB26A444C27)


def write(canary, store, plan, ids, pos, ocl, **kw):
    canary.write(store, plan, input_ids=i64(ids), positions=i64(pos), out_cache_loc=i64(ocl), **kw)


def assert_records(store, before, expected):
    """Records in ``expected`` ({slot: record}) hold those values, every other one is
    as it was."""
    want = before["records"].clone()
    for slot, rec in expected.items():
        want[slot] = i64(rec)
    got = store.records
    for s in range(store.num_slots):
        assert got[s].tolist() == want[s].tolist(), f"slot {s}"


def assert_no_rows(store):
    assert int(store.violation_count) == 0
    assert (store.violations == JUNK).all()


def assert_rows(canary, store, expected, start=0):
    """The ring holds ``expected`` after ``start`` (in order for the reference, which
    appends in the contract's order; as a multiset for the kernels), junk after."""
    got = kept_rows(store, start)
    if canary.name == "reference":
        assert got == [tuple(r) for r in expected]
    else:
        assert multiset(got) == multiset(expected)
    end = start + len(expected)
    assert int(store.violation_count) == end
    assert (store.violations[end:] == JUNK).all()


# --- hashes ---------------------------------------------------------------------------
def test_hash_check_values_python_and_torch():
    assert sm_int(1) == to_signed(0x5692161D100B05E5)
    assert sm_int(ANCHOR_SEED) == H0_SIGNED == to_signed(0xDE7FAE23A9A1B716) == to_signed(H0)
    assert mix3_int(H0_SIGNED, 10, 0) == MIX_H0_10_0
    assert mix3_int(H0_SIGNED, -1, 5) == MIX_H0_M1_5
    # unsigned and signed spellings of one bit pattern hash alike
    assert mix3_int(H0, 10, 0) == MIX_H0_10_0
    assert sm(i64([1, to_signed(ANCHOR_SEED)], "cpu")).tolist() == [sm_int(1), H0_SIGNED]
    got = mix3(i64([H0_SIGNED, H0_SIGNED], "cpu"), i64([10, -1], "cpu"), i64([0, 5], "cpu"))
    assert got.tolist() == [MIX_H0_10_0, MIX_H0_M1_5]


def test_torch_hashes_equal_python_on_extreme_values():
    g = torch.Generator().manual_seed(0)
    values = [0, 1, -1, INT64_MIN, INT64_MAX, 2**31, -(2**31) - 1] + torch.randint(
        INT64_MIN, INT64_MAX, (40,), generator=g
    ).tolist()
    t = i64(values, "cpu")
    assert sm(t).tolist() == [sm_int(v) for v in values]
    rolled = values[1:] + values[:1]
    back = values[::-1]
    assert mix3(t, i64(rolled, "cpu"), i64(back, "cpu")).tolist() == [
        mix3_int(a, b, c) for a, b, c in zip(values, rolled, back)
    ]


def test_written_chain_hashes_are_the_check_values(canary):
    """A seed -1 chain starts at H0; the next record stores mix3(H0, 10, 0), and a row
    of token -1 at position 5 gives mix3(H0, -1, 5); extreme int64 values hash as the
    Python version does."""
    store, plan = new_store(), new_plan()
    before = snapshot_store(store)
    set_write_plan(plan, [0, 3, 5, 7], [-1, -1, -1])
    ids = [10, 11, 12, -1, 1, INT64_MIN, INT64_MAX]
    pos = [0, 1, 2, 5, 6, INT64_MAX, INT64_MIN]
    write(canary, store, plan, ids, pos, [3, 4, 5, 6, 7, 8, 9])
    h1 = MIX_H0_10_0
    h2 = mix3_int(h1, 11, 1)
    h_ext = mix3_int(H0_SIGNED, INT64_MIN, INT64_MAX)
    assert_records(
        store,
        before,
        {
            3: [10, 0, H0_SIGNED, 0],
            4: [11, 1, h1, 0],
            5: [12, 2, h2, 0],
            6: [-1, 5, H0_SIGNED, 0],
            7: [1, 6, MIX_H0_M1_5, 0],
            8: [INT64_MIN, INT64_MAX, H0_SIGNED, 0],
            9: [INT64_MAX, INT64_MIN, h_ext, 0],
        },
    )
    assert counters(store) == (0, 1, 7, 0)
    assert_no_rows(store)


# --- write ----------------------------------------------------------------------------
def test_seed_record_starts_the_chain(canary):
    store, plan = new_store(), new_plan()
    store.records[9] = i64([7, 4, 12345, 99])
    before = snapshot_store(store)
    set_write_plan(plan, [0, 2, 3], [9, -1])
    write(canary, store, plan, [20, 21, 30], [5, 6, 0], [11, 12, 13])
    h = mix3_int(12345, 7, 4)  # hash_of(9)
    assert_records(
        store,
        before,
        {
            11: [20, 5, h, 0],
            12: [21, 6, mix3_int(h, 20, 5), 0],
            13: [30, 0, H0_SIGNED, 0],
        },
    )
    assert counters(store) == (0, 1, 3, 0)
    assert_no_rows(store)


def test_negative_slots_are_skipped_and_do_not_advance_the_chain(canary):
    """A skipped token writes no record, appends no row (even with wrong expected
    inputs or positions), does not advance the chain and is not counted."""
    store, plan = new_store(), new_plan()
    store.records[2] = i64([1, 9, 5, 0])
    store.enable_chain_position_check()
    before = snapshot_store(store)
    set_write_plan(plan, [0, 4], [2])
    ids, pos = [40, 41, 42, 43], [10, 50, 11, 60]
    write(
        canary,
        store,
        plan,
        ids,
        pos,
        [5, -1, 6, -7],
        expected_input_ids=i64([40, 0, 42, 0]),
        expected_positions=i64([10, 0, 11, 0]),
    )
    h = mix3_int(5, 1, 9)
    assert_records(store, before, {5: [40, 10, h, 0], 6: [42, 11, mix3_int(h, 40, 10), 0]})
    assert counters(store) == (0, 1, 2, 0)
    assert_no_rows(store)


def test_idle_rows_and_rows_past_the_count_are_not_read(canary):
    """Rows with hi <= lo write nothing and their seeds (here far out of range) are
    never read; rows at and past write_num_valid_reqs keep junk and are not read."""
    store, plan = new_store(), new_plan(write_req_capacity=8)
    before = snapshot_store(store)
    # row 0 [0, 2), row 1 [2, 2) idle, row 2 [2, 1) reversed, row 3 [1, 5)
    set_write_plan(plan, [0, 2, 2, 1, 5], [-1, 10**9, 10**12, 20])
    write(canary, store, plan, [1, 2, 3, 4, 5], [0, 1, 2, 3, 4], [5, -1, 6, 7, 8])
    h20 = hash_of(before["records"][20].tolist())
    assert_records(
        store,
        before,
        {
            5: [1, 0, H0_SIGNED, 0],
            6: [3, 2, h20, 0],
            7: [4, 3, mix3_int(h20, 3, 2), 0],
            8: [5, 4, mix3_int(mix3_int(h20, 3, 2), 4, 3), 0],
        },
    )
    assert counters(store) == (0, 1, 4, 0)
    assert store.take_status() == 0


def test_duplicate_slot_in_a_row_keeps_the_last_record(canary):
    store, plan = new_store(), new_plan()
    before = snapshot_store(store)
    set_write_plan(plan, [0, 3], [-1])
    write(canary, store, plan, [1, 2, 3], [0, 1, 2], [4, 5, 4])
    h1 = mix3_int(H0_SIGNED, 1, 0)
    assert_records(store, before, {4: [3, 2, mix3_int(h1, 2, 1), 0], 5: [2, 1, h1, 0]})
    assert counters(store) == (0, 1, 3, 0)  # records stored, the duplicate included


def test_expected_input_check_rows(canary):
    store, plan = new_store(), new_plan()
    before = snapshot_store(store)
    set_write_plan(plan, [0, 4], [-1])
    ids, pos = [10, 11, 12, 13], [0, 1, 2, 3]
    write(
        canary,
        store,
        plan,
        ids,
        pos,
        [4, 5, 6, 7],
        launch_tag=-77,
        expected_input_ids=i64([10, 99, 12, 98]),
        expected_positions=i64([0, 1, 7, 8]),
    )
    h = [H0_SIGNED]
    for t, p in zip(ids, pos):
        h.append(mix3_int(h[-1], t, p))
    # the records hold what was written, not what was expected
    assert_records(store, before, {4 + k: [ids[k], pos[k], h[k], 0] for k in range(4)})
    assert_rows(
        canary,
        store,
        [
            (-77, 5, 1, 11, 99, h[1], 1, WT),
            (-77, 6, 2, 12, 12, h[2], 7, WP),
            (-77, 7, 3, 13, 98, h[3], 8, WT | WP),
        ],
    )
    assert counters(store)[1:] == (1, 4, 0)


@pytest.mark.parametrize("flag", [1, 0, -3])
def test_chain_position_check(canary, flag):
    """With the check on, a position that does not follow the row's previous one (from
    the seed's record) appends (tag, s, pos, tok, tok, running, prev_pos + 1,
    WRITE_POSITION); rows seeded with -1 are not checked. Off: nothing."""
    store, plan = new_store(), new_plan()
    store.records[9] = i64([70, 4, 555, 0])
    store.chain_position_check.fill_(flag)  # any non-zero value turns it on
    enabled = flag != 0
    before = snapshot_store(store)
    set_write_plan(plan, [0, 4, 6], [9, -1])
    ids, pos = [1, 2, 3, 4, 5, 6], [5, 7, 8, 10, 3, 9]
    write(
        canary,
        store,
        plan,
        ids,
        pos,
        [11, 12, 13, 14, 15, 16],
        launch_tag=3,
        expected_input_ids=i64([1, 2, 3, 40, 5, 6]),
        expected_positions=i64(pos),
    )
    h = [mix3_int(555, 70, 4)]
    for t, p in zip(ids[:4], pos[:4]):
        h.append(mix3_int(h[-1], t, p))
    g = mix3_int(H0_SIGNED, 5, 3)
    assert_records(
        store,
        before,
        {
            **{11 + k: [ids[k], pos[k], h[k], 0] for k in range(4)},
            15: [5, 3, H0_SIGNED, 0],
            16: [6, 9, g, 0],
        },
    )
    expected = [(3, 14, 10, 4, 40, h[3], 10, WT)]  # the expected-input row comes first
    if enabled:
        expected = [
            (3, 12, 7, 2, 2, h[1], 6, WP),
            expected[0],
            (3, 14, 10, 4, 4, h[3], 9, WP),
        ]
    assert_rows(canary, store, expected)
    assert int(store.chain_position_check) == flag


def test_chain_position_check_skipped_token_keeps_the_previous_position(canary):
    store, plan = new_store(), new_plan()
    store.records[9] = i64([0, 4, 0, 0])
    store.enable_chain_position_check()
    set_write_plan(plan, [0, 3], [9])
    write(canary, store, plan, [1, 2, 3], [5, 99, 6], [11, -1, 12])
    assert_no_rows(store)
    assert counters(store) == (0, 1, 2, 0)


# --- verify ---------------------------------------------------------------------------
def chain_records(store, slots, tokens, first_prev=H0_SIGNED, first_position=0):
    """Write a consistent chain straight into the records (position k at slots[k])."""
    h = first_prev
    for k, (s, t) in enumerate(zip(slots, tokens)):
        store.records[s] = i64([t, first_position + k, h, 0])
        h = mix3_int(h, t, first_position + k)


def test_verify_skips_slot_zero_entries_but_counts_them(canary):
    store, plan = new_store(), new_plan()
    chain_records(store, [5, 6], [50, 60])
    before = snapshot_store(store)
    # slot-0 entries carry junk a look would flag (a predecessor far out of range too)
    set_verify_plan(
        plan, [0, 5, 0, 6, 0], [10**9, -1, -3, 5, 0], [9, 0, 9, 1, 9], [1, 50, 2, 60, 3]
    )
    canary.verify(store, plan, launch_tag=1)
    assert_no_rows(store)
    assert counters(store) == (0, 1, 5, 0)
    assert torch.equal(store.records, before["records"])


def test_unreachable_predecessor_checks_no_chain(canary):
    """prev 0: no CHAIN check, and the row's expected_chain is the record's own hash."""
    store, plan = new_store(), new_plan()
    store.records[5] = i64([3, 7, 999, 0])
    set_verify_plan(plan, [5, 5], [0, 0], [7, 8], [3, -1])
    canary.verify(store, plan, launch_tag=4)
    assert_rows(canary, store, [(4, 5, 7, 3, -1, 999, 999, POS)])
    assert counters(store)[1:] == (1, 2, 0)


def test_chain_head_expects_h0(canary):
    store, plan = new_store(), new_plan()
    store.records[5] = i64([3, 0, H0_SIGNED, 0])
    store.records[6] = i64([4, 0, 1234, 0])
    set_verify_plan(plan, [5, 6, 5], [-1, -1, -9], [0, 0, 0])
    canary.verify(store, plan, launch_tag=2)
    assert_rows(canary, store, [(2, 6, 0, 4, -1, 1234, H0_SIGNED, CHAIN)])


def test_chain_across_blocks_and_corruption(canary):
    """A 530-entry chain over three verify blocks of the kernels. Clean first; then a
    record's token corrupted mid-block and at the last lane of the first and second
    blocks: the entry itself shows VERIFY_TOKEN and its successor CHAIN (across block
    edges too, where the successor loads its predecessor's record)."""
    n = 530
    store = new_store(num_slots=n + 10, violation_capacity=16)
    plan = new_plan(verify_capacity=600)
    slots = [n + 9 - k for k in range(n)]  # descending: neighbours are not adjacent slots
    tokens = [1000 + 3 * k for k in range(n)]
    chain_records(store, slots, tokens)
    set_verify_plan(plan, slots, [-1] + slots[:-1], list(range(n)), tokens)
    canary.verify(store, plan)
    assert_no_rows(store)
    assert counters(store) == (0, 1, n, 0)
    bad = (99, 255, 511)
    recs = {k: store.records[slots[k]].tolist() for k in bad + tuple(k + 1 for k in bad)}
    for k in bad:
        store.records[slots[k], 0] = 7
    canary.verify(store, plan, launch_tag=9)

    def row(k, bits, token=None):
        rec = recs[k]
        tok = rec[0] if token is None else token
        exp_chain = rec[2] if bits == VT else hash_of([7, rec[1] - 1, recs[k - 1][2]])
        return (9, slots[k], rec[1], tok, tokens[k], rec[2], exp_chain, bits)

    assert_rows(canary, store, [r for k in bad for r in (row(k, VT, 7), row(k + 1, CHAIN))])
    assert counters(store)[1:] == (2, 2 * n, 0)


def test_persistent_verify_loop_reaches_every_block(canary):
    """More blocks than the kernels' persistent grid has programs: program 0 takes a
    second turn. The entry at the start of that turn takes its predecessor's hash from
    the entry just before it (the last of the first turn); the last block is checked."""
    from kv_canary_kernels.config import device_config

    store = new_store()
    config = device_config(store.device)
    block = config.launch.verify_block
    k = config.verify_programs * block  # the first entry of program 0's second turn
    n = k + block + 7
    plan = new_plan(verify_capacity=n)
    plan.verify_slot_indices.fill_(0)  # padding entries, looked past
    plan.verify_prev_slot_indices.fill_(-1)
    plan.verify_expected_positions.fill_(0)
    plan.verify_expected_tokens.fill_(-1)
    plan.verify_num_valid.fill_(n)
    plan.verify_enable.fill_(1)
    for i, (s, p, pos, tok) in {
        k - 1: (3, -1, 0, 30),
        k: (4, 3, 1, 40),
        n - 1: (5, 0, 9, -1),
    }.items():
        plan.verify_slot_indices[i], plan.verify_prev_slot_indices[i] = s, p
        plan.verify_expected_positions[i], plan.verify_expected_tokens[i] = pos, tok
    chain_records(store, [3, 4], [30, 40])
    store.records[5] = i64([50, 0, 77, 0])
    canary.verify(store, plan)
    assert_rows(canary, store, [(0, 5, 0, 50, -1, 77, 77, POS)])
    assert counters(store)[1:] == (1, n, 0)
    store.records[3, 0] = 31
    canary.verify(store, plan, launch_tag=1)
    h4 = store.records[4, 2].item()
    assert_rows(
        canary,
        store,
        [
            (1, 3, 0, 31, 30, H0_SIGNED, H0_SIGNED, VT),
            (1, 4, 1, 40, 40, h4, mix3_int(H0_SIGNED, 31, 0), CHAIN),
            (1, 5, 0, 50, -1, 77, 77, POS),
        ],
        start=1,
    )


@pytest.mark.parametrize("count", [0, 1, "two blocks"])
def test_entries_past_the_count_are_not_checked_in_any_block(canary, count):
    """Entries past the count hold what would be violations, status bits or
    out-of-range reads if checked (slots and predecessors past the store, negative, a
    record that does not match): nothing of them shows, in the count's own block of the
    kernel, in later blocks of the programs that have entries and in the blocks of those
    that have none."""
    from kv_canary_kernels.config import device_config

    store = new_store(num_slots=32)
    block = device_config(store.device).launch.verify_block
    capacity = 6 * block + 5
    n = 2 * block + 3 if count == "two blocks" else count
    plan = new_plan(verify_capacity=capacity)
    hostile = torch.tensor(
        [10**12, -5, 31, 3, 33, -(2**62)], dtype=torch.int64, device=store.device
    )
    plan.verify_slot_indices.copy_(hostile.repeat(capacity // 6 + 1)[:capacity])
    plan.verify_prev_slot_indices.copy_(hostile.flip(0).repeat(capacity // 6 + 1)[:capacity])
    plan.verify_expected_positions.fill_(-1)
    plan.verify_expected_tokens.fill_(12345)
    # the first n entries: the head of one clean chain per slot
    store.records[3] = i64([30, 0, H0_SIGNED, 0])
    plan.verify_slot_indices[:n] = 3
    plan.verify_prev_slot_indices[:n] = -1
    plan.verify_expected_positions[:n] = 0
    plan.verify_expected_tokens[:n] = 30
    plan.verify_num_valid.fill_(n)
    plan.verify_enable.fill_(1)
    before = snapshot_store(store)
    canary.verify(store, plan, launch_tag=1)
    assert_no_rows(store)
    assert counters(store) == (0, 1, n, 0)
    assert torch.equal(store.records, before["records"])
    plan.verify_enable.fill_(0)  # an overflowed plan: not one entry checked
    canary.verify(store, plan, launch_tag=2)
    assert counters(store) == (0, 2, n, 0)


@pytest.mark.parametrize("check", [True, False])
def test_token_check_on_and_off(canary, check):
    store, plan = new_store(), new_plan()
    chain_records(store, [5, 6, 7, 8], [50, 60, 70, 80])
    # entry 1: wrong token; entry 2: token -1 (never compared) and wrong position;
    # entry 3: wrong token and wrong position
    set_verify_plan(plan, [5, 6, 7, 8], [-1, 5, 6, 7], [0, 1, 9, 9], [50, 61, -1, 81])
    canary.verify(store, plan, check_expected_tokens=check, launch_tag=5)
    h = [store.records[s, 2].item() for s in (5, 6, 7, 8)]
    if check:
        expected = [
            (5, 6, 1, 60, 61, h[1], h[1], VT),
            (5, 7, 2, 70, -1, h[2], h[2], POS),
            (5, 8, 3, 80, 81, h[3], h[3], POS | VT),
        ]
    else:
        expected = [(5, 7, 2, 70, -1, h[2], h[2], POS), (5, 8, 3, 80, -1, h[3], h[3], POS)]
    assert_rows(canary, store, expected)


def test_overflowed_plan_checks_nothing(canary):
    store, plan = new_store(), new_plan()
    before = snapshot_store(store)
    # entries and count are junk an enabled verify would flag; enable 0 skips them all
    set_verify_plan(plan, [-5, 10**6, 7], [10**6, 10**6, 10**6], [1, 2, 3], enable=0, num_valid=-3)
    canary.verify(store, plan)
    assert counters(store) == (0, 1, 0, 0)
    assert torch.equal(store.records, before["records"])
    assert_no_rows(store)


def test_plan_overflow_from_the_plan_skips_verify(canary):
    store = new_store()
    plan = new_plan(verify_capacity=2)
    plan_reference(
        plan,
        req_pool_indices=i64([1]),
        prefix_lens=i64([3]),
        extend_seq_lens=i64([0]),
        req_to_token=torch.arange(8, dtype=torch.int32, device=DEVICE).reshape(2, 4),
    )
    assert int(plan.verify_enable) == 0
    canary.verify(store, plan)
    assert counters(store) == (0, 1, 0, 0)
    assert_no_rows(store)


def test_window_start_takes_the_real_predecessor(canary):
    """A plan with a sliding window verifies positions P-W..P-1; the first entry's
    predecessor is the real slot of position P-W-1, so a corrupted record just outside
    the window shows as CHAIN on the window's first entry, and records further back are
    not looked at."""
    store = new_store(num_slots=40)
    table = torch.tensor([[0] * 8, [31, 7, 12, 25, 3, 18, 9, 21]], dtype=torch.int32, device=DEVICE)
    lut = torch.arange(40, dtype=torch.int64, device=DEVICE)
    tokens = [100, 101, 102, 103, 104, 105]
    plan = new_plan(verify_capacity=8)
    common = dict(req_pool_indices=i64([1]), req_to_token=table, full_to_swa_index_mapping=lut)
    plan_reference(plan, prefix_lens=i64([0]), extend_seq_lens=i64([6]), **common)
    write(canary, store, plan, tokens, list(range(6)), [31, 7, 12, 25, 3, 18])
    plan_reference(
        plan, prefix_lens=i64([6]), extend_seq_lens=i64([1]), swa_window_size=3, **common
    )
    assert plan.verify_prev_slot_indices[:3].tolist() == [12, 25, 3]
    canary.verify(store, plan)
    assert counters(store) == (0, 2, 6 + 3, 0)
    store.records[31, 0] = 0  # position 0: outside the window, never looked at
    store.records[12, 0] = 555  # position 2: the window's predecessor
    canary.verify(store, plan, launch_tag=8)
    rec = store.records[25].tolist()
    assert_rows(
        canary, store, [(8, 25, 3, 103, -1, rec[2], hash_of(store.records[12].tolist()), CHAIN)]
    )


# --- the ring and the counters -------------------------------------------------------
def violating_plan(plan, store, slots):
    """Entries whose records all fail POSITION (records hold position 0)."""
    for s in slots:
        store.records[s] = i64([s, 0, 0, 0])
    set_verify_plan(plan, slots, [0] * len(slots), [1] * len(slots))
    return [(0, s, 0, s, -1, 0, 0, POS) for s in slots]


def test_ring_fills_once_and_counts_dropped_rows(canary):
    store, plan = new_store(violation_capacity=3), new_plan()
    rows = violating_plan(plan, store, [4, 5, 6, 7, 8])
    canary.verify(store, plan)
    assert int(store.violation_count) == 5
    got = kept_rows(store)
    assert len(got) == 3
    if canary.name == "reference":
        assert got == rows[:3]
    else:
        assert is_sub_multiset(got, rows)
    report = store.take_violations()
    assert (report.appended, report.dropped, len(report.violations)) == (5, 2, 3)
    assert multiset(
        [
            (
                v.launch_tag,
                v.slot,
                v.position,
                v.stored_token,
                v.expected_token,
                v.stored_chain_hash,
                v.expected_aux,
                int(v.fail_bits),
            )
            for v in report.violations
        ]
    ) == multiset(got)
    assert (report.kernel_runs, report.slots_processed) == (1, 5)
    # cleared: ring rows and count; the counters are cumulative
    assert (store.violations == 0).all() and int(store.violation_count) == 0
    assert counters(store) == (0, 1, 5, 0)
    # appends start over at row 0; a ring already full keeps counting
    set_verify_plan(plan, [4, 5], [0, 0], [1, 1])
    canary.verify(store, plan)
    assert multiset(kept_rows(store)) == multiset(rows[:2])
    store.violation_count.fill_(10)
    before = store.violations.clone()
    canary.verify(store, plan)
    assert int(store.violation_count) == 12
    assert torch.equal(store.violations, before)
    assert counters(store)[1:] == (3, 9, 0)


def test_rows_append_after_earlier_rows(canary):
    store, plan = new_store(violation_capacity=8), new_plan()
    first = violating_plan(plan, store, [4, 5])
    canary.verify(store, plan)
    head = kept_rows(store)
    assert multiset(head) == multiset(first)
    second = violating_plan(plan, store, [9, 10, 11])
    canary.verify(store, plan, launch_tag=0)
    assert kept_rows(store)[:2] == head
    assert_rows(canary, store, second, start=2)


def test_counters_count_every_call(canary):
    store, plan = new_store(), new_plan()
    set_write_plan(plan, [0], [], num_rows=0)
    write(canary, store, plan, [], [], [])  # nothing to do: still one run
    assert counters(store) == (0, 1, 0, 0)
    set_write_plan(plan, [0, 3], [-1])
    write(canary, store, plan, [1, 2, 3], [0, 1, 2], [4, -1, 6])
    assert counters(store) == (0, 2, 2, 0)
    set_verify_plan(plan, [], [], [])
    canary.verify(store, plan)
    assert counters(store) == (0, 3, 2, 0)
    set_verify_plan(plan, [4, 0, 6], [-1, 4, 4], [0, 0, 2])  # the slot-0 entry counts
    canary.verify(store, plan)
    assert counters(store) == (0, 4, 5, 0)
    assert_no_rows(store)


# --- real-KV --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(RealKVMode))
def test_real_kv_modes_detect_the_bytes_they_read(canary, mode):
    """NONE reads nothing, PARTIAL the first 16 bytes of a slot, ALL read_bytes (32 of
    64 here): an overwritten byte shows as REAL_KV on its own slot only if read."""
    g = torch.Generator().manual_seed(1)
    store, plan = new_store(num_slots=16), new_plan()
    src = make_source(g, 16, 64, device=DEVICE)
    kv = RealKV(mode=mode, sources=src, page_size=1, bytes_per_token=64, read_bytes=32)
    slots = [3, 4, 5, 6]
    set_write_plan(plan, [0, 4], [-1])
    write(canary, store, plan, [1, 2, 3, 4], [0, 1, 2, 3], slots, real_kv=kv)
    for s in slots:
        assert store.records[s, 3].item() == py_real_kv(kv, s)
        assert (store.records[s, 3].item() == 0) == (mode == RealKVMode.NONE)
    set_verify_plan(plan, slots, [-1] + slots[:-1], [0, 1, 2, 3])
    canary.verify(store, plan, real_kv=kv)
    assert_no_rows(store)
    for s, byte in ((3, 0), (4, 20), (5, 40)):  # in PARTIAL's 16, in ALL's 32, past both
        slot_bytes(src, 1, 64, s)[byte] ^= 0xFF
    canary.verify(store, plan, real_kv=kv, launch_tag=6)
    hit = {RealKVMode.NONE: [], RealKVMode.PARTIAL: [3], RealKVMode.ALL: [3, 4]}[mode]
    expected = []
    for s in hit:
        rec = store.records[s].tolist()
        exp_chain = H0_SIGNED if s == 3 else hash_of(store.records[s - 1].tolist())
        expected.append((6, s, rec[1], rec[0], -1, rec[2], exp_chain, KV))
    assert_rows(canary, store, expected)
    assert int(store.status) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8])
def test_real_kv_sources_pages_and_strided_views(canary, dtype):
    """Four sources of one dtype (one a strided view into a wider buffer, one with extra
    rows), page_size 4: each record's hash is the contract's from the bytes, a clean
    verify passes, and a byte overwritten in the last source flags its own slot only
    (not its page neighbours)."""
    g = torch.Generator().manual_seed(2)
    num_slots, page, bpt = 24, 4, 32
    rows = num_slots // page
    sources = (
        make_source(g, rows, page * bpt, dtype, device=DEVICE),
        make_source(g, rows, page * bpt + 32, dtype, device=DEVICE),  # longer rows
        make_source(g, rows + 2, page * bpt, dtype, device=DEVICE),  # more rows
        make_source(g, rows, page * bpt, dtype, pad_bytes=48, offset_bytes=16, device=DEVICE),
    )
    assert not sources[3].is_contiguous()
    kv = RealKV(mode=RealKVMode.ALL, sources=sources, page_size=page, bytes_per_token=bpt)
    store, plan = new_store(num_slots=num_slots), new_plan()
    slots = [9, 10, 11, 12, 23]
    set_write_plan(plan, [0, 5], [-1])
    write(canary, store, plan, [5, 6, 7, 8, 9], [0, 1, 2, 3, 4], slots, real_kv=kv)
    hashes = [store.records[s, 3].item() for s in slots]
    assert hashes == [py_real_kv(kv, s) for s in slots]
    assert len(set(hashes)) == len(hashes)
    set_verify_plan(plan, slots, [-1] + slots[:-1], [0, 1, 2, 3, 4])
    canary.verify(store, plan, real_kv=kv)
    assert_no_rows(store)
    slot_bytes(sources[3], page, bpt, 10)[bpt - 1] ^= 0x5A
    canary.verify(store, plan, real_kv=kv, launch_tag=1)
    rec = store.records[10].tolist()
    assert_rows(canary, store, [(1, 10, 1, 6, -1, rec[2], hash_of(store.records[9].tolist()), KV)])
    assert py_real_kv(kv, 10) != rec[3]


def test_real_kv_partial_reads_sixteen_bytes_of_each_source(canary):
    g = torch.Generator().manual_seed(3)
    sources = [make_source(g, 8, 32, device=DEVICE) for _ in range(2)]
    kv = RealKV(mode=RealKVMode.PARTIAL, sources=sources, page_size=2, bytes_per_token=16)
    store, plan = new_store(num_slots=16), new_plan()
    set_write_plan(plan, [0, 2], [-1])
    write(canary, store, plan, [1, 2], [0, 1], [6, 7], real_kv=kv)
    assert store.records[6:8, 3].tolist() == [py_real_kv(kv, 6), py_real_kv(kv, 7)]
    slot_bytes(sources[1], 2, 16, 7)[15] ^= 1
    set_verify_plan(plan, [6, 7], [-1, 6], [0, 1])
    canary.verify(store, plan, real_kv=kv)
    assert [r[1] for r in kept_rows(store)] == [7]


@pytest.mark.parametrize("read_bytes", [128, 144, 272, 512])
def test_real_kv_all_hashes_many_words_in_order(canary, read_bytes):
    """Mode ALL over more words than one read of the kernels takes (and a partial last
    read): each record's hash is the contract's (words chained in order), the last byte
    read is checked and the first one past read_bytes is not."""
    g = torch.Generator().manual_seed(read_bytes)
    bpt, page = 512, 2
    sources = (
        make_source(g, 8, page * bpt, device=DEVICE),
        make_source(g, 8, page * bpt, torch.bfloat16, pad_bytes=32, offset_bytes=16, device=DEVICE),
    )
    kv = RealKV(
        mode=RealKVMode.ALL,
        sources=sources,
        page_size=page,
        bytes_per_token=bpt,
        read_bytes=read_bytes,
    )
    store, plan = new_store(num_slots=16), new_plan()
    slots = [5, 6, 7]
    set_write_plan(plan, [0, 3], [-1])
    write(canary, store, plan, [1, 2, 3], [0, 1, 2], slots, real_kv=kv)
    assert store.records[slots, 3].tolist() == [py_real_kv(kv, s) for s in slots]
    set_verify_plan(plan, slots, [-1, 5, 6], [0, 1, 2])
    slot_bytes(sources[1], page, bpt, 6)[read_bytes - 1] ^= 0x80
    if read_bytes < bpt:
        slot_bytes(sources[0], page, bpt, 7)[read_bytes] ^= 0x80  # not read
    canary.verify(store, plan, real_kv=kv)
    assert [r[1] for r in kept_rows(store)] == [6]
    assert int(store.status) == 0
