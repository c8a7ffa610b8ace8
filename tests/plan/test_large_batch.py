"""The one-launch large-batch plan (kv_canary_kernels/plan/large_batch.py): which launches run,
the launch-numbered marks that let one buffers object plan batch after batch, and a launch
whose programs cannot follow the protocol (two launches on the same buffers at once),
which must finish, stay in bounds and say so.

Under the interpreter programs run one after another, in ticket order, and a wait that is
not met at once never is (``MAX_POLLS`` is 1 there)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import kv_canary_kernels.plan.dispatch as plan_module
from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import OFFSETS_BLOCK, SCAN_BLOCK
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import DEFAULT_LAUNCH_CONFIG, launch_config
from tests.helpers import DEVICE
from tests.helpers.plan import assert_buffers_equal, assert_in_bounds, poison, poison_arena


def batch(bs: int, seed: int) -> dict:
    """``bs`` rows, most of them padding (the interpreter's cost is per entry block)."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = 40, 24
    rp = torch.randint(1, rows, (bs,), generator=g)
    rp[torch.rand(bs, generator=g) < 0.9] = 0
    kwargs = dict(
        req_pool_indices=rp,
        prefix_lens=torch.randint(0, cols + 1, (bs,), generator=g),
        extend_seq_lens=torch.randint(0, 4, (bs,), generator=g),
        req_to_token=torch.randint(0, 900, (rows, cols), generator=g).to(I32),
        req_to_verify_expected_tokens=torch.randint(0, 99, (rows, cols), generator=g).to(I32),
        req_to_verify_expected_tokens_valid_lens=torch.randint(0, cols, (bs,), generator=g),
    )
    return {k: v.to(DEVICE) for k, v in kwargs.items()}


@pytest.fixture
def launches(monkeypatch):
    """Names of the plan kernels launched, in order."""
    seen: list[str] = []
    for name in ("_SMALL", "_SUMS", "_OFFSETS", "_ENTRIES", "_LARGE"):
        launcher = getattr(plan_module, name)
        original = launcher.launch_fixed  # what dispatch_plan calls for every launch

        def spy(*args, _name=name, _original=original, **kwargs):
            seen.append(_name)
            return _original(*args, **kwargs)

        # setitem, not setattr: undone by deleting the instance entry (setattr on an
        # instance, undone by a pytest without the fix of its issue 10644, leaves the bound
        # method in the instance's __dict__, which shadows later patches of the class)
        monkeypatch.setitem(launcher.__dict__, "launch_fixed", spy)
    return seen


def expected_plan(bs: int, kwargs: dict, caps: dict) -> PlanBuffers:
    ref = PlanBuffers.allocate(device=DEVICE, **caps)
    poison(ref)
    plan_reference(ref, **kwargs)
    return ref


I32 = torch.int32
CAPS = dict(write_req_capacity=3000, verify_capacity=6000)


def test_one_buffers_object_plans_batch_after_batch_in_one_launch_each(launches):
    """Batches of different sizes (different scanner counts) on one buffers object: each
    plan equals the reference, each ran as one launch, and every chunk of each launch is
    marked with that launch's own number."""
    out = PlanBuffers.allocate(device=DEVICE, **CAPS)
    marks = []
    for i, bs in enumerate([SCAN_BLOCK, 2900, 1300, 2 * SCAN_BLOCK]):  # 5, 12, 6, 9 scanners
        kwargs = batch(bs, seed=i)
        poison(out)
        launch_plan(out, **kwargs)
        assert_buffers_equal(out, expected_plan(bs, kwargs, CAPS), bs)
        assert out.take_status() == PlanStatus.OK
        chunks = -(-(bs + 1) // OFFSETS_BLOCK)
        mark = out.scan_chunk_sums[2, :chunks]
        assert bool((mark == mark[0]).all()), mark
        marks.append(int(mark[0]))
        # this launch's pair counts every program and every chunk; the other pair is 0
        tickets, written = out.launch_sync[mark[0] % 2], out.launch_sync[2 + mark[0] % 2]
        assert int(written) == chunks and int(tickets) > chunks
        assert out.launch_sync[(mark[0] + 1) % 2] == 0 == out.launch_sync[2 + (mark[0] + 1) % 2]
    assert launches == ["_LARGE"] * 4
    assert marks == sorted(set(marks))  # a new number every launch


def test_capture_and_large_batches_take_three_launches(launches, monkeypatch):
    """Inside a CUDA graph capture (the number a launch carries would be replayed) and at
    ``one_launch_max_rows`` rows, the plan takes the three-launch path."""
    bs = SCAN_BLOCK + 5
    kwargs = batch(bs, seed=7)
    ref = expected_plan(bs, kwargs, CAPS)
    out = PlanBuffers.allocate(device=DEVICE, **CAPS)
    monkeypatch.setattr(plan_module, "capturing", lambda device: True)
    poison(out)
    launch_plan(out, **kwargs)
    assert_buffers_equal(out, ref, bs)
    assert launches == ["_SUMS", "_OFFSETS", "_ENTRIES"]
    monkeypatch.setattr(plan_module, "capturing", lambda device: False)
    launches.clear()
    with launch_config(one_launch_max_rows=bs):
        poison(out)
        launch_plan(out, **kwargs)
    assert_buffers_equal(out, ref, bs)
    assert launches == ["_SUMS", "_OFFSETS", "_ENTRIES"]
    assert DEFAULT_LAUNCH_CONFIG.one_launch_max_rows > SCAN_BLOCK


@pytest.mark.parametrize("counter", [5, 10**9, -3])
def test_a_launch_that_finds_the_counters_taken_finishes_in_bounds_and_says_so(counter):
    """Another launch of the same buffers at once would leave the ticket counters taken:
    some program's ticket lies outside [0, grid) and some share of the work has no owner
    (from 5 on, no program is a scanner and the workers stop waiting; from -3, the last
    workers' shares are missing), so the launch sets PLAN_SYNC_LOST; nothing is written
    outside the outputs, and the next launch, which counts in the word this one zeroed, is
    sound again."""
    bs = SCAN_BLOCK + 100  # five scanners
    kwargs = batch(bs, seed=3)
    ref = expected_plan(bs, kwargs, CAPS)
    out = PlanBuffers.allocate(device=DEVICE, **CAPS)
    poison_arena(out)
    out.launch_sync.fill_(counter)
    launch_plan(out, **kwargs)
    assert out.take_status() == PlanStatus.PLAN_SYNC_LOST
    assert_in_bounds(out, bs)
    poison(out)
    launch_plan(out, **kwargs)
    assert out.take_status() == PlanStatus.OK
    assert_buffers_equal(out, ref, bs)


@pytest.mark.parametrize("mark", [0, 2**62, -5])
def test_marks_left_by_other_launches_are_not_read_as_this_ones(mark):
    """Every chunk is marked by its scanner before anyone waits on it, and a wait accepts
    only this launch's numbers: whatever marks earlier launches left, the plan is sound.
    (Under the interpreter programs run in ticket order, so a stale mark is always
    overwritten before it is read: only the GPU run can fail here.)"""
    bs = SCAN_BLOCK + 100
    kwargs = batch(bs, seed=4)
    ref = expected_plan(bs, kwargs, CAPS)
    out = PlanBuffers.allocate(device=DEVICE, **CAPS)
    poison(out)
    out.scan_chunk_sums[2].fill_(mark)
    launch_plan(out, **kwargs)
    assert out.take_status() == PlanStatus.OK
    assert_buffers_equal(out, ref, bs)


@pytest.mark.gpu
def test_a_captured_plan_replays_equal_to_the_reference_beside_eager_ones(launches):
    """On the GPU: a plan captured in a CUDA graph (three launches) replays with refilled
    inputs equal to the reference, and eager plans (one launch) between the replays on the
    same buffers stay equal too."""
    bs = 2 * SCAN_BLOCK + 7
    first, second = batch(bs, seed=11), batch(bs, seed=12)
    inputs = {k: v.clone() for k, v in first.items()}
    out = PlanBuffers.allocate(device=DEVICE, **CAPS)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch_plan(out, **inputs)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    launches.clear()
    with torch.cuda.graph(graph):
        launch_plan(out, **inputs)
    assert launches == ["_SUMS", "_OFFSETS", "_ENTRIES"]
    for kwargs in (first, second, first):
        for k, v in kwargs.items():
            inputs[k].copy_(v)
        poison(out)
        graph.replay()
        torch.cuda.synchronize()
        assert_buffers_equal(out, expected_plan(bs, kwargs, CAPS), bs)
        poison(out)
        launch_plan(out, **kwargs)  # eager, between replays
        assert_buffers_equal(out, expected_plan(bs, kwargs, CAPS), bs)
        assert out.take_status() == PlanStatus.OK
    assert launches.count("_LARGE") == 3


def test_two_buffers_objects_planned_in_turn_stay_sound(launches):
    """Launch numbers belong to the buffers: two objects planned in turn (a draft and a
    target model, two pools) each alternate their own counter pair. With one process-wide
    number, each object saw every other number, the same parity every time, and its
    counters were never zeroed (the review's case: wrong plans from the second step on)."""
    a = PlanBuffers.allocate(device=DEVICE, **CAPS)
    b = PlanBuffers.allocate(device=DEVICE, **CAPS)
    for step in range(3):
        for k, out in enumerate((a, b)):
            bs = SCAN_BLOCK + 10 * step + k
            kwargs = batch(bs, seed=20 + 2 * step + k)
            poison(out)
            launch_plan(out, **kwargs)
            assert out.take_status() == PlanStatus.OK, (step, k)
            assert_buffers_equal(out, expected_plan(bs, kwargs, CAPS), bs)
    assert launches == ["_LARGE"] * 6


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_plans_soundly_beside_its_original(how):
    """A copy numbers its launches from 1 again: its sync words are zeroed, so neither the
    original's counters nor its marks (numbers the copy will reuse) are read as its own."""
    out = PlanBuffers.allocate(device=DEVICE, **CAPS)
    for i in range(3):  # the original's marks reach 3, its counters hold launch 3's
        launch_plan(out, **batch(2900, seed=30 + i))
    copy_ = copy.deepcopy(out) if how == "deepcopy" else pickle.loads(pickle.dumps(out))
    assert not bool(copy_.launch_sync.any()) and not bool(copy_.scan_chunk_sums.any())
    for i, buffers in enumerate((copy_, out, copy_, copy_, out)):
        bs = SCAN_BLOCK + 50 * i
        kwargs = batch(bs, seed=40 + i)
        poison(buffers)
        launch_plan(buffers, **kwargs)
        assert buffers.take_status() == PlanStatus.OK, i
        assert_buffers_equal(buffers, expected_plan(bs, kwargs, CAPS), bs)
