"""The split write's chain and stamp on the host fast path (``kv_canary_kernels.write_split``),
the part a CPU can check with a recording stand-in for the compiled launch: a repeated
chain or stamp passes exactly the first launch's fixed addresses with its own inputs,
``n``, tag, launch number and grid; a launch on other objects, another generation, another
config or variant takes the full path; a store, plan or workspace tampered with or
rebound after caching is refused before anything is launched (the cases of
tests/launch/test_fast_launch.py for the write, on the chain); the interpreter never
caches; and, with a stand-in that hands the cached addresses back to the interpreter as
the tensors they point to, repeated steps through the fast path leave every byte that the
full path leaves. The GPU side (repeated stamps equal to ``launch_write``) is the probe's
and tests/launch/test_gpu_write_split.py's."""

from __future__ import annotations

import contextlib
import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_canary_buffers import CanaryStore, PlanBuffers, WriteWorkspace
from kv_canary_buffers.devices import normalize_device
from kv_canary_kernels import fast_launch, launch_write_chain, launch_write_stamp
from kv_canary_kernels import write_split as split_module
from kv_canary_kernels.config import INTERPRETING, active_launch_config
from kv_canary_kernels.fast_launch import FastPath, addresses
from tests.helpers import DEVICE
from tests.helpers.canary import covers, new_plan
from tests.records.test_property import SETTINGS, gen_real_kv, gen_store, gen_write
from tests.records.test_write_split import assert_same_store


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
    monkeypatch.setattr(split_module, "_FAST_CHAIN", FastPath())
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
    programs = -(-200 // active_launch_config().write_stamp_block)  # one lane a token
    assert programs > 1
    assert full[-5:] == (5, 32, 1, 1, 0) and fast[-5:] == (200, 32, 2, programs, 0)
    assert stamps[1][2] == programs  # the grid
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


# --- the chain's fast path ------------------------------------------------------------------
CHAIN = "canary_write_chain_kernel"
STAMP = "canary_write_stamp_kernel"


def kinds(calls, kernel=CHAIN):
    return [c[0] for c in calls if c[1] == kernel]


def test_a_repeated_chain_passes_the_first_launchs_addresses(recorded):
    store, plan, ws = objects()
    steps = [step(5), step(200)]  # another n and other input tensors, the same fixed args
    for tag, s in enumerate(steps):
        launch_write_chain(store, plan, ws, launch_tag=tag + 7, **s)
    chains = [c for c in recorded if c[1] == CHAIN]
    assert [c[0] for c in chains] == ["full", "fast"]
    full, fast = chains[0][3], chains[1][3]
    assert all(type(a) is int for a in fast)  # addresses, no tensor
    # (5 inputs, 18 fixed, n, capacity, num_slots, violation_capacity, tag, launch, programs)
    assert len(fast) == len(full) == 5 + 18 + 7
    s = steps[1]
    ids, pos, loc = (s[k].data_ptr() for k in ("input_ids", "positions", "out_cache_loc"))
    assert fast[:5] == (ids, pos, loc, ids, pos)  # no expected inputs: ids and positions
    assert fast[5:23] == full[5:23]
    for lo, hi, obj in ((5, 9, plan), (9, 15, store), (15, 23, ws)):
        arena = obj.arena
        assert all(arena.base <= a < arena.base + arena.nbytes for a in fast[lo:hi])
    assert full[23:] == (5, 2, 32, 4, 7, 1, 1) and fast[23:] == (200, 2, 32, 4, 8, 2, 1)
    assert chains[1][2] == chains[0][2] == 1  # the grid
    assert ws.last_chain.launch == 2 and ws.last_chain.n == 200


def test_a_chain_of_another_variant_config_or_object_takes_the_full_path(recorded):
    from kv_canary_kernels.config import launch_config

    store, plan, ws = objects()
    launch_write_chain(store, plan, ws, **step(4))
    s = step(4)
    launch_write_chain(store, plan, ws, **s, expected_input_ids=s["input_ids"],
                       expected_positions=s["positions"])  # fmt: skip
    odd = {k: torch.cat([v[:1], v])[1:] for k, v in step(4).items()}  # 8 bytes off: unaligned
    launch_write_chain(store, plan, ws, **odd)
    with launch_config(write_chain_programs=7):  # another config number
        launch_write_chain(store, plan, ws, **step(4))
    other_store = CanaryStore.allocate(num_slots=32, violation_capacity=4, device=DEVICE)
    launch_write_chain(other_store, plan, ws, **step(4))
    other_plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device=DEVICE)
    launch_write_chain(store, other_plan, ws, **step(4))
    launch_write_chain(store, plan, WriteWorkspace.for_store(store, token_capacity=8), **step(4))
    assert kinds(recorded) == ["full"] * 7
    launch_write_chain(store, plan, ws, **step(3))  # the first combination again: cached
    assert kinds(recorded) == ["full"] * 7 + ["fast"]


@pytest.mark.parametrize("resized", ["store", "plan", "workspace"])
def test_a_new_generation_takes_the_full_path_and_the_old_chain_cannot_be_stamped(
    recorded, resized
):
    """A resize makes a new object (generation + 1, a new arena): its chain takes the full
    path, its own cache entry; a stamp with it after a chain on the old generation is
    refused before anything is launched; the old object keeps its own cached launch."""
    store, plan, ws = objects()
    for _ in range(2):
        launch_write_chain(store, plan, ws, **step(4))
    new = {
        "store": lambda: store.resize(violation_capacity=5),
        "plan": lambda: plan.resize(verify_capacity=5),
        "workspace": lambda: ws.resize(token_capacity=301),
    }[resized]()
    assert new.generation == 1
    objs = {"store": store, "plan": plan, "workspace": ws, resized: new}
    if resized != "workspace":  # the workspace's chain ran with the old generation
        recorded.clear()
        with pytest.raises(ValueError, match=r"^kv-canary: \w+ must be the \w+ the workspace"):
            launch_write_stamp(objs["store"], objs["plan"], ws)
        assert recorded == []
    recorded.clear()
    launch_write_chain(objs["store"], objs["plan"], objs["workspace"], **step(4))
    launch_write_chain(objs["store"], objs["plan"], objs["workspace"], **step(4))
    launch_write_chain(store, plan, ws, **step(4))
    assert kinds(recorded) == ["full", "fast", "fast"]


def _arena_tamperings():
    from tests.launch.test_fast_launch import ARENA_TAMPERINGS

    return ARENA_TAMPERINGS


@pytest.mark.parametrize("case", sorted(_arena_tamperings()))
@pytest.mark.parametrize("tampered", ["store", "plan", "workspace"])
def test_a_cached_chain_refuses_an_object_whose_arena_attributes_were_rebound(
    recorded, case, tampered
):
    """The write's cases (tests/launch/test_fast_launch.py) on the chain, for each of its
    three objects: refused before the cached launch, nothing launched and nothing recorded
    on the host (the workspace's last chain is still the one before)."""
    store, plan, ws = objects()
    for _ in range(2):
        launch_write_chain(store, plan, ws, **step(4))
    assert kinds(recorded) == ["full", "fast"]
    last = ws.last_chain
    _arena_tamperings()[case]({"store": store, "plan": plan, "workspace": ws}[tampered])
    recorded.clear()
    with pytest.raises(ValueError, match=r"^kv-canary: "):
        launch_write_chain(store, plan, ws, **step(4))
    assert recorded == []
    assert ws._last_chain == [last]


def _new(kind, store):
    if kind == "store":
        return CanaryStore.allocate(num_slots=32, violation_capacity=4, device=DEVICE)
    if kind == "plan":
        return PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device=DEVICE)
    return WriteWorkspace.for_store(store, token_capacity=300)


KIND = {"store": "CanaryStore", "plan": "PlanBuffers", "workspace": "WriteWorkspace"}


@pytest.mark.parametrize("kind", sorted(KIND))
def test_a_chain_refuses_an_arena_claimed_and_rebound_from_a_dead_object(recorded, kind):
    import gc

    store, plan, ws = objects()
    objs = {"store": store, "plan": plan, "workspace": ws}
    objs[kind] = _new(kind, store)
    for _ in range(2):
        launch_write_chain(objs["store"], objs["plan"], objs["workspace"], **step(4))
    arena = objs[kind].arena
    objs[kind] = None
    gc.collect()
    b = _new(kind, store)
    arena.claim(b, KIND[kind])  # a public method: the dead owner's arena, claimed
    object.__setattr__(b, "arena", arena)
    objs[kind] = b
    recorded.clear()
    with pytest.raises(
        ValueError, match=rf"^kv-canary: {KIND[kind]}\.\w+ is (not|no longer) the memory"
    ):
        launch_write_chain(objs["store"], objs["plan"], objs["workspace"], **step(4))
    assert recorded == []


@pytest.mark.parametrize("kind", sorted(KIND))
def test_a_rebound_arena_handle_does_not_reach_another_objects_cached_chain(recorded, kind):
    """The chain's cache is keyed by the arenas' construction-time handles and bases, and
    a handle rebound to another live object's is refused: nothing reaches the other
    object's arena, which still takes its own cached launch."""
    store, plan, ws = objects()
    objs = {"store": store, "plan": plan, "workspace": ws}
    for _ in range(2):
        launch_write_chain(store, plan, ws, **step(4))
    b = _new(kind, store)
    object.__setattr__(b.arena, "handle", objs[kind].arena.handle)
    recorded.clear()
    with pytest.raises(ValueError, match=rf"^kv-canary: {KIND[kind]}\.arena\.handle must be"):
        launch_write_chain(*{**objs, kind: b}.values(), **step(4))
    assert recorded == []
    launch_write_chain(store, plan, ws, **step(4))
    ((k, _name, _grid, addrs),) = recorded
    assert k == "fast" and not any(b.arena.base <= a < b.arena.base + b.arena.nbytes
                                   for a in addrs if type(a) is int)  # fmt: skip


@pytest.mark.skipif(not INTERPRETING, reason="the interpreter's rule")
def test_the_interpreter_never_caches_a_chain():
    store, plan, ws = objects()
    split_module._FAST_CHAIN.clear()
    for _ in range(2):
        launch_write_chain(store, plan, ws, **step(3))
    assert len(split_module._FAST_CHAIN) == 0


# --- the fast path's launches, run: equal to the full path's --------------------------------
@contextlib.contextmanager
def interpreted_fast_path():
    """The fast path on under the interpreter: a launch not repeated from the cache runs
    in the interpreter (the full path, tensors) and returns a stand-in for the compiled
    launch that turns each address it is handed back into the tensor at that address (the
    full launch's own tensor, or an input the test registered in ``live``) and runs the
    interpreter on them: what a GPU would run, on the CPU. Yields ``(calls, live, mp)``."""
    calls: list[str] = []
    live: dict[int, torch.Tensor] = {}
    real_launch = fast_launch.Launcher.launch

    def full_launch(self, device, grid, key, args, constexprs, options):
        real_launch(self, device, grid, key, args, constexprs, options)
        name = self.fn.__name__
        calls.append(f"full {name}")

        def go(programs, stream, *got):
            assert len(got) == len(args)
            rebuilt = []
            for template, value in zip(args, got):
                if isinstance(template, torch.Tensor):
                    assert type(value) is int
                    rebuilt.append(template if value == template.data_ptr() else live[value])
                else:
                    rebuilt.append(value)
            calls.append(f"fast {name}")
            self.fn[(programs, 1, 1)](*rebuilt, **constexprs, **options)

        return go

    with pytest.MonkeyPatch.context() as mp:
        for launcher in (split_module._CHAIN, split_module._STAMP):
            mp.delitem(launcher.__dict__, "launch", raising=False)
        mp.setattr(fast_launch.Launcher, "launch", full_launch)
        index = normalize_device(DEVICE).index
        mp.setattr(split_module, "current_device", lambda: index)
        mp.setattr(split_module, "stream_of", lambda index: 0)
        mp.setattr(split_module, "_FAST_STAMP", FastPath())
        mp.setattr(split_module, "_FAST_CHAIN", FastPath())
        yield calls, live, mp


@pytest.mark.skipif(not INTERPRETING, reason="the fast path's arguments, run in the interpreter")
@settings(max_examples=4, **SETTINGS)
@given(seed=st.integers(0, 2**32 - 1))
def test_repeated_steps_through_the_fast_path_equal_the_full_path(seed):
    """Generated steps (valid and hostile data, expected inputs, inputs 8 bytes off
    alignment, real-KV sources), each run twice as chain + stamp on two copies of a store,
    once on the fast path (every launch after a combination's first from the cache) and
    once on the full path: the stores and the workspaces end byte for byte equal, and the
    fast path was taken."""
    rng = random.Random(seed)
    num_slots = 40
    store = gen_store(rng, num_slots, 64)
    store.violation_count.fill_(0)
    fast_store, full_store = copy.deepcopy(store), copy.deepcopy(store)
    plan = new_plan(4, 16)
    real_kv = gen_real_kv(rng, num_slots)
    if real_kv is not None and not covers(real_kv, num_slots):
        real_kv = None
    fast_ws, full_ws = (WriteWorkspace.for_store(store, token_capacity=32) for _ in range(2))
    with interpreted_fast_path() as (calls, live, mp):
        for _ in range(4):
            kwargs = gen_write(rng, fast_store, plan, hostile=rng.random() < 0.3)
            for name in ("input_ids", "positions", "out_cache_loc"):
                if rng.random() < 0.3 and kwargs[name].numel():  # 8 bytes off alignment
                    t = kwargs[name]
                    kwargs[name] = torch.cat([t[:1], t])[1:]
            live.update({t.data_ptr(): t for t in kwargs.values() if isinstance(t, torch.Tensor)})
            # Each step twice: its second chain and stamp repeat a cached combination.
            for path, st_, ws in (("fast", fast_store, fast_ws), ("full", full_store, full_ws)):
                mp.setattr(fast_launch, "FAST_PATH", path == "fast")
                for _ in range(2):
                    launch_write_chain(st_, plan, ws, **kwargs)
                    launch_write_stamp(st_, plan, ws, real_kv=real_kv)
    assert "fast canary_write_chain_kernel" in calls
    assert "fast canary_write_stamp_kernel" in calls
    assert_same_store(fast_store, full_store, ordered=True)
    assert torch.equal(fast_ws.arena.byte_view(), full_ws.arena.byte_view())
