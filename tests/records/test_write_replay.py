"""Write violations on multi-token rows where only some lanes fail a write check (the
kernel appends in a replay walk of those lanes only), a violation after a skipped token
and after a duplicate slot, lanes in two programs, and the ring filling during the write;
out-of-range slots and real-KV rows before a violation (kernels against the loop model);
the edges of the first walk's one-counter position check (kernels against the reference)."""

import pytest
import torch

from kv_canary_buffers import FailBits, RealKV, RealKVMode
from kv_canary_buffers.layout import INT64_MAX, INT64_MIN
from kv_canary_kernels.config import launch_config
from tests.helpers.canary import (
    CANARY_PATHS,
    DEVICE,
    assert_store_matches_model,
    counters,
    i64,
    kept_rows,
    make_source,
    model_state,
    model_write,
    multiset,
    new_plan,
    new_store,
    set_write_plan,
)

ROWS = 40  # two write programs of 32 lanes


def replay_case(expected: bool, count0: int):
    store = new_store(num_slots=32, violation_capacity=4)
    store.records[9] = i64([70, 4, 555, 0])
    store.enable_chain_position_check()
    store.violation_count.fill_(count0)
    plan = new_plan(write_req_capacity=ROWS)
    #  row 0 (seed 9, suspect): 11 ok, skipped, 12 (token/position fails), 11 again
    #        (duplicate; position jump), 13 ok;  row 1 (seed -1): clean, 3 tokens;
    #  rows 2..32 idle;  row 33 (program 1, seed 9): skipped, 20 fails, 21 ok
    #  row 34 (program 1, seed 9): clean, 2 tokens
    ocl = [11, -1, 12, 11, 13, 1, 2, 3, -1, 20, 21, 22, 23]
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    pos = [5, 99, 7, 10, 11, 0, 1, 2, 50, 9, 10, 5, 6]
    offsets = [0, 5, 8] + [8] * 31 + [11, 13]
    seeds = [9, -1] + [-1] * 31 + [9, 9]
    set_write_plan(plan, offsets, seeds)
    kw = dict(input_ids=i64(ids), positions=i64(pos), out_cache_loc=i64(ocl), launch_tag=-5)
    if expected:
        exp_ids = list(ids)
        exp_ids[2], exp_ids[9] = 30, 100
        exp_pos = list(pos)
        exp_pos[9] = 6
        kw.update(expected_input_ids=i64(exp_ids), expected_positions=i64(exp_pos))
    return store, plan, kw


PATHS = [("reference", 16), ("kernels", 16), ("kernels", 0)]
"""Each path with ``write_chain_tokens``: with 0 the kernels walk every row's chain (and
its checks and violation rows) in a chain program, with 16 in the side program."""


@pytest.mark.parametrize("expected", [True, False])
@pytest.mark.parametrize("count0", [0, 2, 4, 9])  # 2: fills during the write; 4, 9: full
@pytest.mark.parametrize(("path", "chain_tokens"), PATHS)
def test_replay_rows_equal_the_model(path, chain_tokens, expected, count0):
    store, plan, kw = replay_case(expected, count0)
    model = model_write(model_state(store), plan, **kw, chain_position_check=True)
    assert len(model.rows) >= 3  # row 0: >= 2 rows, row 33: >= 1, rows 1 and 34 none
    with launch_config(write_chain_tokens=chain_tokens):
        CANARY_PATHS[path].write(store, plan, **kw)
    assert_store_matches_model(store, model, rows_before=count0, ordered=path == "reference")
    if count0 == 0 and expected:
        assert {r[1] for r in model.rows} == {12, 11, 20}


def short_kv():
    g = torch.Generator().manual_seed(5)
    src = (
        make_source(g, 4, 64, spare_rows=4, device=DEVICE),
        make_source(g, 6, 64, spare_rows=2, device=DEVICE),
    )
    return RealKV(mode=RealKVMode.ALL, sources=src, page_size=2, bytes_per_token=32)


@pytest.mark.parametrize("chain_tokens", [0, 16])
def test_replay_after_out_of_range_slot_and_real_kv_row(chain_tokens):
    """Kernels only (the reference raises): a slot past the store and a slot whose page
    row lies past a source, each before a violating token of the same row."""
    store = new_store(num_slots=16, violation_capacity=3)
    store.records[5] = i64([1, 3, 77, 0])
    store.enable_chain_position_check()
    store.violation_count.fill_(1)  # fills during the write
    plan = new_plan(write_req_capacity=4)
    #  row 0 (seed 5): 2 ok, 16 (past the store), 3 position 9 fails; row 1: 9 (page 4,
    #  past source 0), 4 token fails, 6 ok; row 2 clean
    ocl = [2, 16, 3, 9, 4, 6, 7, 1]
    ids = [10, 11, 12, 13, 14, 15, 16, 17]
    pos = [4, 5, 9, 0, 1, 2, 0, 1]
    exp_ids = list(ids)
    exp_ids[4] = 99
    set_write_plan(plan, [0, 3, 6, 8], [5, -1, -1])
    kw = dict(
        input_ids=i64(ids),
        positions=i64(pos),
        out_cache_loc=i64(ocl),
        launch_tag=2,
        expected_input_ids=i64(exp_ids),
        expected_positions=i64(pos),
        real_kv=short_kv(),
    )
    model = model_write(model_state(store), plan, **kw, chain_position_check=True)
    assert model.status and len(model.rows) == 2
    with launch_config(write_chain_tokens=chain_tokens):
        CANARY_PATHS["kernels"].write(store, plan, **kw)
    assert_store_matches_model(store, model, rows_before=1)


def counter_edge_case(expected: bool, check: bool):
    store = new_store(num_slots=32, violation_capacity=8)
    store.records[9] = i64([70, 4, 555, 0])
    store.records[10] = i64([71, INT64_MAX, 556, 0])
    store.records[11] = i64([72, INT64_MAX - 1, 557, 0])
    if check:
        store.enable_chain_position_check()
    plan = new_plan(write_req_capacity=ROWS)
    #  row 0 (seed 9, position 4): 5 ok, 9 fails (6 wanted), 10 and 11 follow the failed
    #        one (ok by the contract's rule, not by the first walk's counter), 7 fails (12)
    #  row 1 (seed 10, INT64_MAX): INT64_MIN, INT64_MIN + 1 wrap and are ok
    #  row 2 (seed 11, INT64_MAX - 1): INT64_MAX ok, INT64_MIN + 1 fails (INT64_MIN
    #        wanted), skipped, INT64_MIN + 2 ok
    #  row 3 (seed -1, no check): anything goes;  row 4 (seed 9): 5, skipped, 6, a
    #        duplicate slot at 7: clean by position;  row 33 (program 1, seed 9): 6 fails
    ocl = [12, 13, 14, 15, 16, 17, 18, 19, 20, -1, 21, 22, 23, 24, 25, -1, 26, 25, 27]
    pos = [5, 9, 10, 11, 7, INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MIN + 1, 50,
           INT64_MIN + 2, 100, 3, 3, 5, 99, 6, 7, 6]  # fmt: skip
    ids = list(range(1, len(ocl) + 1))
    offsets = [0, 5, 7, 11, 14, 18] + [18] * 28 + [19]
    seeds = [9, 10, 11, -1, 9] + [-1] * 28 + [9]
    set_write_plan(plan, offsets, seeds)
    kw = dict(input_ids=i64(ids), positions=i64(pos), out_cache_loc=i64(ocl), launch_tag=7)
    if expected:  # a token off in row 4 (clean by position) and one in row 1
        exp_ids = list(ids)
        exp_ids[17] = exp_ids[5] = 0
        kw.update(expected_input_ids=i64(exp_ids), expected_positions=i64(pos))
    return store, plan, kw


@pytest.mark.parametrize("chain_tokens", [0, 16])
@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("expected", [True, False])
def test_position_counter_edges_equal_the_reference(expected, check, chain_tokens):
    """The first walk checks positions against one counter (the seed's position + 1,
    advanced by each ok token): after a lane's first failure it disagrees with the
    contract's rule, so the replay must append by the rule; across INT64_MAX it wraps as
    the rule does; a lane without a seed checks nothing."""
    stores = {}
    for path in ("reference", "kernels"):
        store, plan, kw = counter_edge_case(expected, check)
        with launch_config(write_chain_tokens=chain_tokens):
            CANARY_PATHS[path].write(store, plan, **kw)
        stores[path] = store
    ref, ker = stores["reference"], stores["kernels"]
    assert torch.equal(ker.records, ref.records)
    assert counters(ker) == counters(ref)
    assert multiset(kept_rows(ker)) == multiset(kept_rows(ref))
    wp = int(FailBits.WRITE_POSITION)
    position_rows = {(r[1], r[2], r[6]) for r in kept_rows(ref) if r[7] == wp}
    # (slot, position, wanted)
    edges = {(13, 9, 6), (16, 7, 12), (20, INT64_MIN + 1, INT64_MIN), (27, 6, 5)}
    assert position_rows == (edges if check else set())
    assert int(ref.violation_count) == 4 * check + 2 * expected
    assert int(ref.slots_processed) == 17


def long_rows_case(expected: bool, real_kv: bool):
    """Rows longer than ``write_chain_tokens`` (16): their chains, checks and violation
    rows are a chain program's, their other columns a side program's."""
    store = new_store(num_slots=120, violation_capacity=16)
    store.records[9] = i64([70, 4, 555, 0])
    store.records[8] = i64([71, 30, 556, 0])
    store.enable_chain_position_check()
    plan = new_plan(write_req_capacity=ROWS)
    ocl, ids, pos = [], [], []
    #  row 0 (seed 9, position 4; 40 tokens): slot 9 itself first (the seed, read before
    #  it is overwritten), slot 9 again at token 20, a skipped token, a slot past the
    #  store, slot 110 (with sources: its page lies past the shorter source, as do row
    #  33's slots from 96 on), a position jump at token 30 (then followed by its own
    #  successors). No two rows write one slot (the result would be unspecified).
    row0 = list(range(20, 60))
    row0[0] = row0[20] = 9
    row0[5] = -1
    row0[11] = 120 + 3
    row0[14] = 110  # page 55: past the 48 rows of the shorter source
    p = 4
    for i, s in enumerate(row0):
        ocl.append(s)
        ids.append(1000 + i)
        if 0 <= s < 120:
            p = p + 1 if i != 30 else p + 7
        pos.append(p if 0 <= s < 120 else 77)
    #  row 1 (3 tokens, no seed): short, the side program's; row 2 (25 tokens, no seed): a
    #  duplicate slot; rows 3..32 idle; row 33 (18 tokens, seed 8 at position 30)
    for i, s in enumerate([60, 61, 62]):
        ocl.append(s), ids.append(i), pos.append(i)
    row2 = list(range(63, 88))
    row2[24] = 70
    for i, s in enumerate(row2):
        ocl.append(s), ids.append(5 * i), pos.append(i)
    for i, s in enumerate(range(88, 106)):
        ocl.append(s), ids.append(7 * i), pos.append(31 + i)
    n0, n1, n2 = 40, 43, 68
    rows = (ocl[:n0], ocl[n0:n1], ocl[n1:n2], ocl[n2:])
    written = [{s for s in r if 0 <= s < 120} for r in rows]
    assert sum(map(len, written)) == len(set().union(*written))  # no slot in two rows
    offsets = [0, n0, n1, n2] + [n2] * 30 + [n2 + 18]
    seeds = [9, -1, -1] + [-1] * 30 + [8]
    set_write_plan(plan, offsets, seeds)
    kw = dict(input_ids=i64(ids), positions=i64(pos), out_cache_loc=i64(ocl), launch_tag=3)
    if expected:  # tokens off in rows 0, 2 and 33
        exp_ids = list(ids)
        exp_ids[2] = exp_ids[n1 + 7] = exp_ids[n2 + 17] = -9
        exp_pos = list(pos)
        exp_pos[25] = 0
        kw.update(expected_input_ids=i64(exp_ids), expected_positions=i64(exp_pos))
    if real_kv:
        g = torch.Generator().manual_seed(11)
        src = (
            make_source(g, 60, 64, spare_rows=0, device=DEVICE),
            make_source(g, 48, 64, spare_rows=3, device=DEVICE),
        )
        kw["real_kv"] = RealKV(
            mode=RealKVMode.PARTIAL, sources=src, page_size=2, bytes_per_token=32
        )
    return store, plan, kw


@pytest.mark.parametrize("real_kv", [False, True])
@pytest.mark.parametrize("expected", [True, False])
def test_long_rows_split_between_chain_and_side_programs_equal_the_model(expected, real_kv):
    store, plan, kw = long_rows_case(expected, real_kv)
    model = model_write(model_state(store), plan, **kw, chain_position_check=True)
    assert model.rows  # the jump in row 0 at least
    CANARY_PATHS["kernels"].write(store, plan, **kw)
    assert_store_matches_model(store, model)
    # the seed slot's record is its second write's, chained from the seed's first record
    assert int(store.records[9, 0]) == 1020
