"""The split write's stamp on the host fast path (``kv_canary_kernels.write_split``), the
part a CPU can check with a recording stand-in for the compiled launch: a repeated stamp
passes exactly the first launch's fixed addresses with its own ``n``, launch number and
grid; a stamp on other objects takes the full path; a tampered workspace is refused
before anything is launched; the interpreter never caches. The GPU side (repeated stamps
equal to ``launch_write``) is the probe's and tests/launch/test_gpu_write_split.py's."""

from __future__ import annotations

import pytest
import torch

from kv_canary_buffers import CanaryStore, PlanBuffers, WriteWorkspace
from kv_canary_buffers.devices import normalize_device
from kv_canary_kernels import fast_launch, launch_write_chain, launch_write_stamp
from kv_canary_kernels import write_split as split_module
from kv_canary_kernels.config import INTERPRETING
from kv_canary_kernels.fast_launch import FastPath, addresses
from tests.helpers import DEVICE


@pytest.fixture
def recorded(monkeypatch):
    calls: list[tuple] = []

    def full_launch(self, device, grid, key, args, constexprs, options):
        calls.append(("full", self.fn.__name__, grid[0], addresses(args)))
        return lambda programs, stream, *a: calls.append(("fast", self.fn.__name__, programs, a))

    for launcher in (split_module._CHAIN, split_module._STAMP):
        monkeypatch.delitem(launcher.__dict__, "launch", raising=False)
    monkeypatch.setattr(fast_launch.Launcher, "launch", full_launch)
    monkeypatch.setattr(fast_launch, "FAST_PATH", True)
    index = normalize_device(DEVICE).index
    monkeypatch.setattr(split_module, "current_device", lambda: index)
    monkeypatch.setattr(split_module, "stream_of", lambda index: 0)
    monkeypatch.setattr(split_module, "_FAST_STAMP", FastPath())
    return calls


def objects():
    store = CanaryStore.allocate(num_slots=32, violation_capacity=4, device=DEVICE)
    plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device=DEVICE)
    ws = WriteWorkspace.for_store(store, token_capacity=300)
    return store, plan, ws


def step(n):
    t = torch.arange(n, device=DEVICE)
    return dict(input_ids=t, positions=t, out_cache_loc=t % 30 + 1)


def test_a_repeated_stamp_passes_the_first_launchs_addresses(recorded):
    store, plan, ws = objects()
    for n in (5, 200):  # a larger step: another grid, the same fixed addresses
        launch_write_chain(store, plan, ws, **step(n))
        launch_write_stamp(store, plan, ws)
    stamps = [c for c in recorded if c[1] == "canary_write_stamp_kernel"]
    assert [c[0] for c in stamps] == ["full", "fast"]
    full, fast = stamps[0][3], stamps[1][3]
    # (fixed..., n, num_slots, launch, programs, num_sources)
    assert fast[:-5] == full[:-5]
    assert full[-5:] == (5, 32, 1, 1, 0) and fast[-5:] == (200, 32, 2, 2, 0)
    assert stamps[1][2] == 2  # the grid: ceil(200 / 128)
    assert all(type(a) is int for a in fast)  # addresses, no tensor


def test_other_objects_take_the_full_path_and_a_tampered_workspace_is_refused(recorded):
    store, plan, ws = objects()
    launch_write_chain(store, plan, ws, **step(4))
    launch_write_stamp(store, plan, ws)
    other_ws = WriteWorkspace.for_store(store, token_capacity=300)
    launch_write_chain(store, plan, other_ws, **step(4))
    launch_write_stamp(store, plan, other_ws)
    stamps = [c[0] for c in recorded if c[1] == "canary_write_stamp_kernel"]
    assert stamps == ["full", "full"]
    launch_write_chain(store, plan, ws, **step(4))
    ws.entries.untyped_storage().resize_(0)  # its storage freed through an alias
    recorded.clear()
    with pytest.raises(ValueError, match=r"^kv-canary: "):
        launch_write_stamp(store, plan, ws)
    assert recorded == []


@pytest.mark.skipif(not INTERPRETING, reason="the interpreter's rule")
def test_the_interpreter_never_caches_a_stamp():
    store, plan, ws = objects()
    split_module._FAST_STAMP.clear()
    for _ in range(2):
        launch_write_chain(store, plan, ws, **step(3))
        launch_write_stamp(store, plan, ws)
    assert len(split_module._FAST_STAMP) == 0
