"""The split write's doors and its replay semantics.

Host side (both paths): a workspace of the wrong type or too small, inputs inside it, a
stamp with no chain, a second stamp of one chain, a stamp with another store, plan
buffers or generation than its chain's: refused with a ``kv-canary:`` error, nothing
written (store, plan, workspace, the host record). A chain not followed by its stamp is
replaced by the next chain.

Device side (the kernels, as a CUDA graph replays them: the dispatch without the host
check): a stamp replayed without its chain, or after another launch's chain, stamps
nothing and raises ``WRITE_CHAIN_STALE``; a replayed pair stamps only its own fill's
entries, never an entry an earlier fill left at an index the step does not write."""

import copy

import pytest
import torch

from kv_canary_buffers import (
    CanaryStatus,
    WriteWorkspace,
    write_chain_reference,
    write_reference,
    write_stamp_reference,
)
from kv_canary_buffers.write import (
    WriteStampArgs,
    _check_fresh,
    validate_write_chain_args,
    validate_write_stamp_args,
)
from kv_canary_kernels import launch_write_chain, launch_write_stamp
from kv_canary_kernels.write_split import dispatch_write_chain, dispatch_write_stamp
from tests.helpers.canary import (
    DEVICE,
    assert_plan_equal,
    assert_store_equal,
    i64,
    kept_rows,
    multiset,
    new_plan,
    new_store,
    set_write_plan,
    snapshot_plan,
    snapshot_store,
)

PATHS = {
    "reference": (write_chain_reference, write_stamp_reference),
    "kernels": (launch_write_chain, launch_write_stamp),
}
STALE = CanaryStatus.WRITE_CHAIN_STALE


@pytest.fixture(params=sorted(PATHS))
def split(request):
    return PATHS[request.param]


def step(offsets=(0, 3, 5), ocl=(11, 12, 13, 20, 21), seeds=(9, -1), positions=None):
    """A store (slot 9 a seed record), a plan of ``len(seeds)`` rows and the write's
    keywords; the check of positions on."""
    store = new_store(num_slots=32, violation_capacity=8)
    store.records[9] = i64([70, 4, 555, 0])
    store.enable_chain_position_check()
    plan = new_plan(write_req_capacity=4)
    set_write_plan(plan, list(offsets), list(seeds))
    n = len(ocl)
    pos = list(positions) if positions is not None else [5, 6, 8, 0, 1][:n]
    kw = dict(
        input_ids=i64(list(range(100, 100 + n))),
        positions=i64(pos),
        out_cache_loc=i64(list(ocl)),
        launch_tag=3,
    )
    return store, plan, kw


def workspace_of(store, tokens=8):
    return WriteWorkspace.for_store(store, token_capacity=tokens)


def snapshot(store, plan, ws):
    return snapshot_store(store), snapshot_plan(plan), ws.arena.byte_view().clone(), ws.last_chain


def assert_unchanged(store, plan, ws, before):
    s, p, w, last = before
    assert_store_equal(store, s)
    assert_plan_equal(plan, p)
    assert torch.equal(ws.arena.byte_view(), w), "the workspace was written"
    assert ws.last_chain == last, "the host record changed"


# --- host side --------------------------------------------------------------------------
def test_the_pair_equals_one_write_on_both_paths(split):
    store, plan, kw = step()
    want = copy.deepcopy(store)
    write_reference(want, plan, **kw)
    ws = workspace_of(store)
    chain, stamp = split
    chain(store, plan, ws, **kw)
    assert int(store.kernel_runs) == int(want.kernel_runs) - 1  # the stamp counts the pair
    assert torch.equal(store.records[11:14], new_store(32, 8).records[11:14])  # no record yet
    stamp(store, plan, ws)
    assert store.records.tolist() == want.records.tolist()
    assert store.owners.tolist() == want.owners.tolist()
    assert multiset(kept_rows(store, context=True)) == multiset(kept_rows(want, context=True))
    assert int(store.violation_count) == 1  # token 2's position: 8 after 6
    assert [int(store.kernel_runs), int(store.slots_processed)] == [
        int(want.kernel_runs),
        int(want.slots_processed),
    ]
    assert ws.last_chain is not None and ws.last_chain.stamped


def test_a_workspace_of_the_wrong_type_is_refused(split):
    store, plan, kw = step()
    chain, stamp = split
    for bad in (None, store, plan, object()):
        before = snapshot_store(store)
        with pytest.raises(TypeError, match=r"^kv-canary: workspace must be a kv_canary_buffers"):
            chain(store, plan, bad, **kw)
        with pytest.raises(TypeError, match=r"^kv-canary: workspace must be a kv_canary_buffers"):
            stamp(store, plan, bad)
        assert_store_equal(store, before)


def test_a_workspace_too_small_is_refused_before_anything_is_written(split):
    store, plan, kw = step()
    chain, stamp = split
    small = WriteWorkspace.allocate(token_capacity=4, slot_capacity=32, device=DEVICE)
    before = snapshot(store, plan, small)
    with pytest.raises(
        ValueError,
        match=r"^kv-canary: workspace.token_capacity must be >= n = len\(out_cache_loc\) = 5, "
        r"got 4 \(grow it",
    ):
        chain(store, plan, small, **kw)
    assert_unchanged(store, plan, small, before)
    few_slots = WriteWorkspace.allocate(token_capacity=8, slot_capacity=31, device=DEVICE)
    before = snapshot(store, plan, few_slots)
    for call in (
        lambda: chain(store, plan, few_slots, **kw),
        lambda: stamp(store, plan, few_slots),
    ):
        with pytest.raises(
            ValueError, match=r"^kv-canary: workspace.slot_capacity must be >= store.num_slots = 32"
        ):
            call()
    assert_unchanged(store, plan, few_slots, before)
    grown = few_slots.ensure_capacity(tokens=5, slots=32)
    chain(store, plan, grown, **kw)  # grown: accepted
    stamp(store, plan, grown)


def test_an_input_inside_the_workspace_is_refused(split):
    store, plan, kw = step()
    ws = workspace_of(store)
    before = snapshot(store, plan, ws)
    inside = ws.entry_owners[:5]
    inside.copy_(kw["positions"])
    before = snapshot(store, plan, ws)
    with pytest.raises(
        ValueError, match=r"^kv-canary: positions must not share memory with the WriteWorkspace"
    ):
        split[0](store, plan, ws, **{**kw, "positions": inside})
    assert_unchanged(store, plan, ws, before)


def test_a_stamp_without_a_chain_or_a_second_stamp_is_refused(split):
    store, plan, kw = step()
    ws = workspace_of(store)
    chain, stamp = split
    before = snapshot(store, plan, ws)
    with pytest.raises(
        ValueError,
        match=r"^kv-canary: workspace must hold a chain not yet stamped .* got a workspace no "
        "chain ran on",
    ):
        stamp(store, plan, ws)
    assert_unchanged(store, plan, ws, before)
    chain(store, plan, ws, **kw)
    stamp(store, plan, ws)
    before = snapshot(store, plan, ws)
    with pytest.raises(ValueError, match=r"whose last chain \(launch 1\) was already stamped"):
        stamp(store, plan, ws)
    assert_unchanged(store, plan, ws, before)


def test_a_stamp_with_another_store_plan_or_generation_is_refused(split):
    store, plan, kw = step()
    ws = workspace_of(store)
    chain, stamp = split
    chain(store, plan, ws, **kw)
    others = {
        "store": (copy.deepcopy(store), plan),
        "store ": (store.resize(violation_capacity=9), plan),  # generation 1
        "plan_buffers": (store, copy.deepcopy(plan)),
        "plan_buffers ": (store, plan.resize(verify_capacity=17)),
    }
    for name, (s, p) in others.items():
        before = snapshot(s, p, ws)
        kind = "CanaryStore" if name.startswith("store") else "PlanBuffers"
        with pytest.raises(
            ValueError,
            match=rf"^kv-canary: {name.strip()} must be the {kind} the workspace's chain "
            r"\(launch 1\) ran with \(generation 0\), got another",
        ):
            stamp(s, p, ws)
        assert_unchanged(s, p, ws, before)
    stamp(store, plan, ws)  # its own: accepted


def test_a_chain_without_its_stamp_is_replaced_by_the_next_chain(split):
    """Step 1's chain (a violation row) is never stamped: step 2's chain replaces it; the
    stamp writes step 2's records only (as one write of step 2), and step 1's rows stand."""
    store, plan, kw1 = step()
    _, _, kw2 = step(positions=[5, 9, 10, 0, 1])  # another violation, other tokens
    kw2["input_ids"] = kw2["input_ids"] + 50
    ws = workspace_of(store)
    chain, stamp = split
    want1 = copy.deepcopy(store)
    write_reference(want1, plan, **kw1)
    want2 = copy.deepcopy(store)
    write_reference(want2, plan, **kw2)
    chain(store, plan, ws, **kw1)
    chain(store, plan, ws, **kw2)
    assert ws.last_chain.launch == 2
    stamp(store, plan, ws)
    assert store.records.tolist() == want2.records.tolist()
    assert store.owners.tolist() == want2.owners.tolist()
    assert int(store.kernel_runs) == int(want2.kernel_runs)
    assert int(store.slots_processed) == int(want2.slots_processed)
    assert multiset(kept_rows(store, context=True)) == multiset(
        kept_rows(want1, context=True) + kept_rows(want2, context=True)
    )


def test_the_validations_write_nothing_and_return_the_stamps_numbers():
    store, plan, kw = step()
    ws = workspace_of(store)
    args = validate_write_chain_args(store, plan, ws, **kw)
    assert args.workspace is ws and args.write.n == 5
    assert ws.last_chain is None  # recorded by the launch, after the checks
    launch_write_chain(store, plan, ws, **kw)
    stamp_args = validate_write_stamp_args(store, plan, ws)
    assert (stamp_args.n, stamp_args.launch, stamp_args.real_kv) == (5, 1, None)
    assert not ws.last_chain.stamped


# --- device side: what a CUDA graph replays ---------------------------------------------
def replay_chain(store, plan, ws, kw, launch):
    args = validate_write_chain_args(store, plan, ws, **kw)
    dispatch_write_chain(store, plan, ws, args.write, launch)


def replay_stamp(store, ws, n, launch):
    dispatch_write_stamp(store, ws, WriteStampArgs(n, launch, None))


def test_a_stamp_replayed_without_its_chain_stamps_nothing_and_flags():
    store, plan, kw = step()
    ws = workspace_of(store)
    launch_write_chain(store, plan, ws, **kw)
    launch_write_stamp(store, plan, ws)
    want = snapshot_store(store)
    assert store.take_status() == CanaryStatus.OK
    store.records[11] = i64([1, 2, 3, 4])  # a stale stamp would overwrite it
    want["records"][11] = i64([1, 2, 3, 4])
    replay_stamp(store, ws, 5, 1)  # the graph's stamp, replayed alone
    assert int(store.status) == int(STALE)
    store.status.zero_()
    assert_store_equal(store, want)  # no record, no count, no run


def test_a_stamp_after_another_launchs_chain_is_stale():
    store, plan, kw = step()
    ws = workspace_of(store)
    replay_chain(store, plan, ws, kw, launch=7)
    before = snapshot_store(store)
    replay_stamp(store, ws, 5, 6)  # captured with launch 6's chain
    assert int(store.status) == int(STALE)
    store.status.zero_()
    assert_store_equal(store, before)
    # Any stamp takes the fill's tickets, so its own stamp after that is stale too (one
    # stamp per fill: the bit says the step was not stamped).
    replay_stamp(store, ws, 5, 7)
    assert int(store.status) == int(STALE)
    store.status.zero_()
    assert_store_equal(store, before)
    replay_chain(store, plan, ws, kw, launch=7)  # the next replay of the pair: fresh
    replay_stamp(store, ws, 5, 7)
    assert int(store.status) == 0 and int(store.kernel_runs) == int(before["kernel_runs"]) + 1


def test_a_replayed_pair_stamps_only_its_own_fill():
    """Two replays of one captured pair (same launch number, same ``n``): between them
    the plan shrinks to its first row (what a GraphInputs refill does), so indices 3 and 4
    are not written by the second fill; their slots' records must stay as they are."""
    store, plan, kw = step()
    ws = workspace_of(store)
    for replay in range(2):
        replay_chain(store, plan, ws, kw, launch=1)
        replay_stamp(store, ws, 5, 1)
        assert int(store.status) == 0, replay
        if replay == 0:
            assert store.records[20, 0] == 103 and store.records[21, 0] == 104
            set_write_plan(plan, [0, 3], [9])
            store.records[20] = i64([-1, -2, -3, -4])
            store.records[21] = i64([-5, -6, -7, -8])
    assert store.records[20].tolist() == [-1, -2, -3, -4]
    assert store.records[21].tolist() == [-5, -6, -7, -8]
    assert int(store.kernel_runs) == 2


def test_the_torch_stamp_refuses_what_the_kernel_flags():
    """The reference raises where the kernel raises WRITE_CHAIN_STALE (the references'
    rule for data the kernels flag), and writes nothing; a kernel stamp after a torch
    stamp of one fill is stale too (the paths share the device words)."""
    store, plan, kw = step()
    ws = workspace_of(store)
    write_chain_reference(store, plan, ws, **kw)
    write_stamp_reference(store, plan, ws)
    with pytest.raises(ValueError, match=r"^kv-canary: workspace must hold the fresh fill"):
        _check_fresh(ws, WriteStampArgs(5, 1, None))
    before = snapshot_store(store)
    replay_stamp(store, ws, 5, 1)
    assert int(store.status) == int(STALE)
    store.status.zero_()
    assert_store_equal(store, before)
