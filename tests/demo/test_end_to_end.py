"""End to end: the toy engine (``kv_canary_demo``) runs the whole canary,
plan, HEAD verify, forward, write and TAIL verify, for many steps: prefill in chunks, then
decode, requests finishing and their slots reused, the KV pool and the plan buffers growing.

A clean run has no violation at all; each corruption kind is caught with the bits and at
the slot the injection names, by the launch the step order says. The torch references run
at a moderate size; the Triton kernels (the interpreter on the CPU) at a small one, with
reference stores fed the same inputs and compared every step.
"""

from __future__ import annotations

import pytest
import torch

from kv_canary_buffers import FailBits
from kv_canary_demo import Corruption, LaunchTag, SimConfig, Simulation

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: on the CPU, one thread is several times faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reference_config(**kwargs) -> SimConfig:
    return SimConfig.for_max_seq_len(64, max_batch=8, device=DEVICE, **kwargs)


def kernel_config(**kwargs) -> SimConfig:
    # small: each Triton program costs milliseconds in the interpreter
    return SimConfig.for_max_seq_len(16, max_batch=8, device=DEVICE, kernels=True, **kwargs)


def run(sim: Simulation, steps: int, *, raise_at: int = -1) -> Simulation:
    for i in range(steps):
        if i == raise_at:
            sim.raise_batch_limit()
        sim.step()
    return sim


def assert_healthy(sim: Simulation) -> None:
    s = sim.stats
    assert s.plan_mismatches == 0, sim.messages
    assert s.store_mismatches == 0, sim.messages
    assert not s.plan_flags and not s.canary_flags


# --- clean runs -----------------------------------------------------------------------
def test_clean_run_with_the_references_has_no_violation():
    sim = run(Simulation(reference_config(seed=5)), 60, raise_at=30)
    s = sim.stats
    assert sim.seen == []
    assert_healthy(sim)
    # the run did what a serving engine does
    assert s.prefill_rows > 0 and s.decode_rows > s.prefill_rows
    assert s.finished >= 20 and s.aborted == 0
    assert s.reused_slots > 100  # finished requests' slots went to new ones
    assert s.overflow_steps >= 1  # a step verified nothing, then the buffers grew
    assert s.pool_resizes == 1 and all(g.head.generation == 1 for g in sim.groups)
    assert sim.groups[0].buffers.write_req_capacity == 16
    assert s.verify_entries > 10_000 and s.write_entries > 1000
    # every store saw every launch: 2 verifies and 2 writes a step each for HEAD and TAIL
    for g in sim.groups:
        assert int(g.head.kernel_runs) == 2 * s.steps
        assert int(g.tail.kernel_runs) == 2 * s.steps


def test_clean_run_with_only_the_head_store():
    sim = run(Simulation(reference_config(seed=6, tail=False)), 30)
    assert sim.seen == [] and sim.groups[0].tail is None
    assert_healthy(sim)


def test_clean_run_with_the_kernels_matches_the_reference_stores():
    sim = run(Simulation(kernel_config(seed=0)), 6, raise_at=3)
    assert sim.stages.kernels and sim.groups[0].shadow_head is not None
    assert sim.seen == []
    assert_healthy(sim)
    assert sim.stats.finished >= 1 and sim.stats.reused_slots >= 1
    assert sim.stats.pool_resizes == 1


# --- each corruption kind -----------------------------------------------------------
# (kind, steps after the injection it is caught with the TAIL store / without, launch)
WHEN = {
    Corruption.DOUBLE_ALLOCATION: (0, 1),
    Corruption.FREED_PAGE_REUSED: (0, 1),
    Corruption.RECORD_OVERWRITTEN: (1, 1),
    Corruption.KV_OVERWRITTEN: (0, 1),
    Corruption.POSITION_OFF_BY_ONE: (0, 0),
    Corruption.WRONG_TOKEN_WRITTEN: (0, 0),
    Corruption.STALE_EXPECTED_TOKEN: (0, 0),
}


def launch_of(tag: int) -> str:
    return LaunchTag(tag).name.rsplit("_", 1)[0]  # e.g. "HEAD_VERIFY"


def run_until_caught(sim: Simulation, kind: Corruption, *, at: int, limit: int = 20):
    for i in range(limit):
        if i == at:
            sim.inject(kind)
        sim.step()
        if sim.injections and sim.injections[0].caught and i >= at + 2:
            break
    assert not sim.pending, f"{kind.value} was never injected"
    (inj,) = sim.injections
    return inj


@pytest.mark.parametrize("tail", [True, False], ids=["head+tail", "head-only"])
@pytest.mark.parametrize("kind", list(Corruption), ids=lambda k: k.name.lower())
def test_each_kind_is_caught_with_its_bits_and_slot(kind, tail):
    # a verify capacity that never overflows: the step that catches it is exact
    sim = Simulation(reference_config(seed=11, tail=tail, verify_capacity_per_row=64))
    inj = run_until_caught(sim, kind, at=4)
    assert inj.caught, f"{kind.value} not caught: {sim.messages}"
    v = inj.first
    assert (v.fail_bits & kind.expected_bits) == kind.expected_bits
    first_seen = next(s for s in sim.seen if s.violation is v)
    assert first_seen.full_slot in inj.slots
    assert first_seen.group == "full" or v.slot == int(sim.lut[first_seen.full_slot])
    delay = WHEN[kind][0 if tail else 1]
    assert inj.caught_step == inj.step + delay
    launch = launch_of(v.launch_tag)
    if kind is Corruption.WRONG_TOKEN_WRITTEN:
        assert launch == "HEAD_WRITE" and v.stored_token != v.expected_token
    elif delay == 0 and kind in (
        Corruption.DOUBLE_ALLOCATION,
        Corruption.FREED_PAGE_REUSED,
        Corruption.KV_OVERWRITTEN,
    ):
        assert launch == "TAIL_VERIFY"  # what this step's forward and write did
    else:
        assert launch == "HEAD_VERIFY"
    # every violation concerns a request the injection damaged, and those were aborted
    assert all(sim.explained(s) for s in sim.seen)
    assert not any(r.id in inj.victims for r in sim.running)
    assert sim.stats.aborted >= 1
    assert_healthy(sim)


def test_the_decoded_violations_say_what_happened():
    sim = Simulation(reference_config(seed=3, verify_capacity_per_row=64))
    stale = run_until_caught(sim, Corruption.STALE_EXPECTED_TOKEN, at=3).first
    # the record holds the token the write stamped; the pool holds another one
    assert stale.fail_bits == FailBits.VERIFY_TOKEN
    assert "[VERIFY_TOKEN]" in str(stale) and f"slot {stale.slot}" in str(stale)

    sim = Simulation(reference_config(seed=3, verify_capacity_per_row=64))
    swapped = run_until_caught(sim, Corruption.POSITION_OFF_BY_ONE, at=3)
    # position p now points at the slot of position p + 1: its record says p + 1
    position = int(swapped.where.split("swapped positions ")[1].split()[0])
    assert swapped.first.position == position + 1


def test_a_record_overwritten_in_the_head_store_is_not_seen_by_the_tail_store():
    sim = Simulation(reference_config(seed=4, verify_capacity_per_row=64))
    inj = run_until_caught(sim, Corruption.RECORD_OVERWRITTEN, at=3)
    assert inj.caught_by.startswith("HEAD store")
    (slot,) = inj.slots
    assert not [s for s in sim.seen if s.store == "TAIL" and s.full_slot == slot]


def test_every_kind_with_the_kernels_in_one_run():
    # seed 8 gives every kind a request within 7 steps (the limit only guards a change)
    sim = Simulation(kernel_config(seed=8, verify_capacity_per_row=16))
    for kind in Corruption:
        sim.inject(kind)
    for _ in range(20):
        sim.step()
        if not sim.pending and all(inj.caught for inj in sim.injections):
            break
    caught = {inj.kind for inj in sim.injections if inj.caught}
    assert caught == set(Corruption), sim.messages
    for inj in sim.injections:
        assert (inj.first.fail_bits & inj.kind.expected_bits) == inj.kind.expected_bits
    assert all(sim.explained(s) for s in sim.seen)
    assert_healthy(sim)  # the kernels' stores equal the reference stores, step by step


@pytest.mark.gpu
def test_cuda_graph_replay_catches_every_kind():
    config = SimConfig(max_batch=16, device="cuda", seed=0, kernels=True, graphs=True)
    sim = Simulation(config)
    for i in range(40):
        if i == 20:
            sim.raise_batch_limit()
        if 3 <= i < 24 and (i - 3) % 3 == 0:
            sim.inject(list(Corruption)[(i - 3) // 3])
        sim.step()
    assert sim.stats.captures >= 2  # once per generation
    assert len(sim.stats.step_us) > 20
    assert {inj.kind for inj in sim.injections if inj.caught} == set(Corruption)
    assert all(sim.explained(s) for s in sim.seen)
    assert_healthy(sim)
