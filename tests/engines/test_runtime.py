"""The engine-neutral runtime against a tiny fake paged engine (no engine installed): a
clean run, every fault kind caught with the right request (each with the write in one
call and split: ``split`` parametrizes them), the verify stride, the sweep, polling,
policies, growth, the health check and bad input. Torch references unless a test says
otherwise (short runs with the Triton kernels, under the interpreter on CPU)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch

from kv_canary_buffers import CanaryStatus, FailBits, RealKVMode
from kv_canary_engines import (
    BlockTable,
    CanaryConfig,
    CanaryRuntime,
    CanaryViolationError,
    Endpoint,
    KVGroup,
    Row,
    StepBatch,
    TokenSlots,
    decode_tag,
    expand_into_req_to_token,
    launch_tag,
)
from kv_canary_engines.faults import FaultKind, Injection, explained, first_catch
from kv_canary_engines.runtime import SPLIT_FROM_TOKENS
from tests.engines.fake_engine import PAGE, FakeEngine, Req, default_config

SGLANG_LINE = re.compile(
    r"^kv_canary violation: launch_tag=(\S+) fail_reason=(\S+) slot_idx=\d+ position=-?\d+ "
    r"stored_token=-?\d+ expected_token=-?\d+ stored_chain_hash=0x[0-9a-f]{16} "
    r"expected_aux=0x[0-9a-f]{16} "
)


SPLIT = pytest.mark.parametrize("split", [False, True], ids=["one-write", "split"])
"""Runs a test with ``CanaryConfig(split_write=False)`` (one write a store, after the
forward) and ``True`` (the chain in ``begin_step``, the stamp in ``end_step``)."""


def workload(engine: FakeEngine, n: int = 16, output: int = 16) -> None:
    """Requests of 3 to 20 tokens, every third one sharing a 12-token prompt prefix."""
    shared = engine.rand_tokens(12)
    for i in range(n):
        if i % 3 == 0:
            prompt = shared + engine.rand_tokens(1 + i % 4)
        else:
            prompt = engine.rand_tokens(3 + (7 * i) % 18)
        engine.add(f"req-{i}", prompt, output)


def violations(engine: FakeEngine) -> list:
    return [v for r in engine.reports for v in r.violations]


def reference_tokens(**engine_kwargs: object) -> dict[str, list[int]]:
    engine = FakeEngine(**engine_kwargs)  # type: ignore[arg-type]
    workload(engine)
    engine.run(200)
    return engine.finished


# --- clean runs ----------------------------------------------------------------------
@SPLIT
@pytest.mark.parametrize("tables", ["block", "token"])
def test_a_clean_run_has_no_violation_and_the_same_tokens(tables, split):
    engine = FakeEngine(tables=tables)
    runtime = engine.attach(default_config(sweep_every=5, split_write=split))
    workload(engine)
    engine.run(200)
    assert len(engine.finished) == 16
    assert violations(engine) == []
    assert runtime.health.executing
    st = runtime.stats
    # chunked prefill, prefix hits and block reuse all happened
    assert st.chunked_rows > 0 and st.prefix_hits > 0 and st.sweeps > 0
    blocks = [b for _, b in engine.allocations]
    assert len(blocks) > len(set(blocks))
    assert st.steps >= 40
    assert engine.finished == reference_tokens(tables=tables)


def _store_state(runtime: CanaryRuntime) -> list[tuple[object, ...]]:
    """Every store's records, owners and counters (read back: a sync)."""
    out: list[tuple[object, ...]] = []
    for group in runtime.groups:
        for store in runtime.stores(group.name):
            if store is not None:
                out.append(
                    (
                        store.records.cpu().tolist(),
                        store.owners.cpu().tolist(),
                        int(store.kernel_runs),
                        int(store.slots_processed),
                    )
                )
    return out


def _faulted_run(engine: FakeEngine, runtime: CanaryRuntime, fault: str | None) -> tuple:
    """8 requests, 6 steps, then ``fault`` on the first running request (``off_by_one``:
    one step writing its KV one slot off; ``kv_overwritten``: a byte of its first block
    changed), 30 steps more and a poll: the victim and the final report."""
    workload(engine, n=8, output=10)
    engine.run(6)
    victim = engine.running[0]
    if fault == "off_by_one":
        engine.slot_shift[victim.id] = 1
        engine.step()
        del engine.slot_shift[victim.id]
    elif fault == "kv_overwritten":
        engine.kv.view(-1, 8)[victim.blocks[0] * PAGE, 0] += 1.0
    engine.run(30)
    return victim, runtime.poll()


@pytest.mark.parametrize("tables", ["block", "token"])
@pytest.mark.parametrize("fault", [None, "off_by_one", "kv_overwritten"])
def test_the_split_write_leaves_what_one_write_leaves(tables, fault):
    # the same run with the write in one call and split: the same records, owners and
    # counters in every store, the same report lines in the same order, the same tokens
    seen = []
    for split in (False, True):
        engine = FakeEngine(tables=tables, window=6 if tables == "block" else 0)
        runtime = engine.attach(default_config(split_write=split, sweep_every=4, verify_every=2))
        assert runtime.split_write is split
        victim, final = _faulted_run(engine, runtime, fault)
        lines = [v.line for v in violations(engine)] + [v.line for v in final.violations]
        flags = [(r.plan_status, r.canary_status) for r in [*engine.reports, final]]
        seen.append((lines, flags, _store_state(runtime), engine.finished, runtime.stats))
    assert seen[0] == seen[1]
    lines = seen[0][0]
    assert bool(lines) is (fault is not None)
    if fault is not None:  # the fault named its victim in both runs
        assert any(f"request_id={victim.id}" in line for line in lines), lines[:3]


@pytest.mark.parametrize("fault", [None, "kv_overwritten"])
def test_the_split_by_step_length_leaves_what_one_write_leaves(fault):
    # split_write=None on CUDA splits only the steps where some row writes at least
    # SPLIT_FROM_TOKENS tokens (here forced on the CPU through the resolved threshold): a
    # run mixing split and one-write steps leaves what one write leaves
    seen, launched = [], []
    for mode in ("one", "by length"):
        engine = FakeEngine(num_blocks=200, chunk=40)
        runtime = engine.attach(default_config(split_write=mode != "one", sweep_every=4))
        if mode == "by length":
            runtime.split_from_tokens = SPLIT_FROM_TOKENS
        calls: list[str] = []
        for name in ("chain", "write", "write_pair"):
            real = getattr(runtime.stages, name)

            def call(
                *args: object, _name: str = name, _real=real, _calls=calls, **kwargs: object
            ) -> None:
                _calls.append(_name)
                _real(*args, **kwargs)

            object.__setattr__(runtime.stages, name, call)
        for i in range(6):
            engine.add(f"r{i}", engine.rand_tokens(10 + 5 * i), 6)  # 10 to 35 tokens
        engine.run(4)
        if fault == "kv_overwritten":
            victim = _decoding(engine, min_blocks=1)
            engine.kv.view(-1, 8)[victim.blocks[0] * PAGE, 0] += 1.0
        engine.run(20)
        final = runtime.poll()
        lines = [v.line for v in violations(engine)] + [v.line for v in final.violations]
        seen.append((lines, _store_state(runtime), engine.finished))
        launched.append(calls)
    assert seen[0] == seen[1]
    assert "chain" not in launched[0]
    assert 0 < launched[1].count("chain") and 0 < launched[1].count("write_pair")  # both kinds
    assert "write" not in launched[0] + launched[1]  # (HEAD and TAIL: the pair, one call)
    assert bool(seen[0][0]) is (fault is not None)


@pytest.mark.parametrize("fault", [None, "kv_overwritten", "off_by_one"])
def test_the_overlapped_begin_leaves_what_the_begin_before_the_forward_leaves(fault):
    # overlap_begin launches begin_step's work from end_step (on the CPU in order, after
    # the forward): the same records, owners, counters and tokens, with one write and
    # with the split; the same report lines, but for a forward that writes a wrong slot,
    # which the HEAD verify may now see in the step itself (the same victims either way)
    seen = []
    for overlap, split in ((False, False), (True, False), (True, True)):
        engine = FakeEngine(window=6, num_blocks=120)
        runtime = engine.attach(
            default_config(overlap_begin=overlap, split_write=split, sweep_every=4, verify_every=2)
        )
        assert runtime.overlap_begin is overlap and runtime.side_stream is None
        victim, final = _faulted_run(engine, runtime, fault)
        steps = runtime.stats.steps  # every step split / overlapped when forced
        assert (runtime.split_steps, runtime.overlapped_steps) == (split * steps, overlap * steps)
        found = [*violations(engine), *final.violations]
        named = {rid for v in found for rid in v.request_ids()}
        seen.append(([v.line for v in found], named, _store_state(runtime), engine.finished))
    assert seen[0][2:] == seen[1][2:] == seen[2][2:]
    assert seen[0][1] == seen[1][1] == seen[2][1]
    if fault != "off_by_one":
        assert seen[0][0] == seen[1][0] == seen[2][0]
    assert bool(seen[0][0]) is (fault is not None)
    if fault is not None:
        assert victim.id in seen[0][1]


def test_the_overlapped_begin_raises_the_batchs_errors_at_end_step_and_recovers():
    group = KVGroup(name="full", num_slots=64, page_size=4)
    rt = CanaryRuntime(default_config(overlap_begin=True), [group], device="cpu")
    assert CanaryConfig().overlap_begin is None  # on CUDA with the kernels (it ran on the H200)
    auto = CanaryRuntime(default_config(overlap_begin=None), [group], device="cpu")
    assert not auto.overlap_begin and auto.side_stream is None  # None: CUDA only
    assert auto.overlap_from_tokens == SPLIT_FROM_TOKENS and rt.overlap_from_tokens == 0
    rows = [Row(request_id="a", prefix_len=0, extend_len=2, tokens=[5])]
    rt.begin_step(_batch(rows=rows))  # held, nothing checked or launched yet
    with pytest.raises(RuntimeError, match="poll called between begin_step and end_step"):
        rt.poll()
    with pytest.raises(RuntimeError, match="begin_step called twice"):
        rt.begin_step(_batch())
    assert rt.step == 1  # the step's number is taken in begin_step, as without the overlap
    with pytest.raises(ValueError, match="kv-canary: request 'a': tokens holds 1 positions"):
        rt.end_step()
    with pytest.raises(RuntimeError, match="end_step called without begin_step"):
        rt.end_step()
    rt.begin_step(_batch())
    rt.discard_step()  # a forward that raised: nothing was launched for it
    rt.begin_step(_batch())
    report = rt.end_step()  # poll_every=1
    assert report is not None and report.violations == () and rt.step == 3
    store = rt.stores("full")[0]
    assert int(store.records[4, 0]) == 5 and int(store.records[5, 0]) == 6  # stamped


def test_the_split_threshold_follows_the_kernels_chain_tokens():
    # SPLIT_FROM_TOKENS is the default write_chain_tokens + 1; a runtime with the kernels
    # reads the active LaunchConfig's, one with the references the constant
    from kv_canary_kernels.config import DEFAULT_LAUNCH_CONFIG, launch_config

    assert SPLIT_FROM_TOKENS == DEFAULT_LAUNCH_CONFIG.write_chain_tokens + 1
    group = KVGroup(name="full", num_slots=64, page_size=4)
    for stages, chain_tokens, want in (("kernels", 40, 41), ("reference", 40, SPLIT_FROM_TOKENS)):
        with launch_config(write_chain_tokens=chain_tokens):
            rt = CanaryRuntime(
                default_config(stages=stages, split_write=None, overlap_begin=None),
                [group],
                device="cpu",
            )
        assert rt.split_from_tokens == rt.overlap_from_tokens == want
    forced = CanaryRuntime(
        default_config(stages="reference", split_write=True, overlap_begin=True),
        [group],
        device="cpu",
    )
    assert forced.split_from_tokens == forced.overlap_from_tokens == 0


def _step_of(rows: list[Row], first: int, count: int) -> StepBatch:
    """Request "a" at positions ``first .. first + count - 1``, its blocks 1, 2, ... (page
    4: slot ``4 + position``)."""
    pos = torch.arange(first, first + count)
    tokens = torch.tensor(rows[0].tokens[first : first + count])
    return StepBatch(
        rows=rows,
        tables={"full": BlockTable(table=torch.arange(1, 9).view(1, -1))},
        out_cache_loc={"full": 4 + pos},
        input_ids=tokens,
        positions=pos,
    )


def test_the_default_overlap_holds_only_the_steps_with_a_long_row():
    # overlap_begin=None on CUDA: the steps where some row writes SPLIT_FROM_TOKENS tokens
    # overlap, the others run the begin before the forward (the rule emulated on the CPU,
    # where None resolves to no overlap); both kinds of step leave the same records
    group = KVGroup(name="full", num_slots=256, page_size=4)
    stores = []
    for overlap in (False, True):
        rt = CanaryRuntime(default_config(overlap_begin=overlap), [group], device="cpu")
        rt.overlap_from_tokens = SPLIT_FROM_TOKENS
        n = SPLIT_FROM_TOKENS
        tokens = list(range(7, 7 + n + 1))
        long_rows = [Row(request_id="a", prefix_len=0, extend_len=n, tokens=tokens)]
        rt.begin_step(_step_of(long_rows, 0, n))
        assert (rt._held is not None) is overlap and (rt._pending is None) is overlap
        rt.end_step()
        decode = [Row(request_id="a", prefix_len=n, extend_len=1, tokens=tokens)]
        rt.begin_step(_step_of(decode, n, 1))
        assert rt._held is None and rt._pending is not None  # before the forward
        assert rt.end_step() is not None and rt.stats.steps == 2
        assert rt.overlapped_steps == int(overlap) and rt.split_steps == 0
        stores.append(rt.stores("full")[0].records.clone())
    assert torch.equal(stores[0], stores[1])
    assert int(stores[0][4 + n, 0]) == tokens[n]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_released_during_its_first_forward_keeps_no_row(overlap):
    # an engine that drops a request during the forward (an abort): with the overlap the
    # release waits until end_step has assigned the step's rows, so none is left behind;
    # runtime.step during the forward is the same either way
    engine = FakeEngine()
    runtime = engine.attach(default_config(overlap_begin=overlap, poll_every=1000))
    steps_seen: list[int] = []

    def abort_x(eng: FakeEngine, batch: list, out: object) -> None:
        steps_seen.append(runtime.step)
        if any(r.id == "x" for r in batch):
            eng.abort(frozenset({"x"}))

    engine.in_forward.append(abort_x)
    engine.add("x", engine.rand_tokens(5), 4)
    engine.add("y", engine.rand_tokens(5), 4)
    engine.step()
    assert steps_seen == [1]
    assert runtime.live_requests() == frozenset({"y"})
    engine.run(6)
    assert runtime.poll().violations == () and violations(engine) == []


def test_a_sliding_window_group_verifies_only_its_window():
    engine = FakeEngine(window=6, prefix_cache=False)
    runtime = engine.attach(default_config())
    workload(engine, n=6, output=20)
    engine.run(8)
    assert violations(engine) == []
    victim = _decoding(engine, min_blocks=3)
    engine.kv.view(-1, 8)[victim.blocks[0] * PAGE, 0] += 1.0  # position 0: out of the window
    engine.run(2)
    groups = {v.group for v in violations(engine)}
    assert groups == {"full"}  # the window group no longer reads position 0
    pos = victim.cached - 2  # inside the window
    engine.kv.view(-1, 8)[victim.blocks[pos // PAGE] * PAGE + pos % PAGE, 0] += 1.0
    engine.run(1)
    recent = [v for v in violations(engine) if v.group == "swa"]
    assert recent and all(v.request_ids() == {victim.id} for v in recent)
    assert runtime.health.executing


def test_rows_start_at_one_and_a_released_row_is_reused_after_the_poll():
    engine = FakeEngine()
    runtime = engine.attach(default_config(poll_every=1000))
    engine.add("a", engine.rand_tokens(5), 2)
    engine.step()
    assert runtime.rows.row_of("a") == 1  # never 0, the plan's padding row
    engine.abort(frozenset({"a"}))
    engine.add("b", engine.rand_tokens(5), 2)
    engine.step()
    assert runtime.rows.row_of("b") == 2  # "a"'s row waits for the poll
    runtime.poll()
    engine.add("c", engine.rand_tokens(5), 2)
    engine.step()
    assert runtime.rows.row_of("c") == 1


def test_writes_run_every_step_and_verifies_every_n():
    engine = FakeEngine()
    runtime = engine.attach(default_config(verify_every=3, tail=True, poll_every=1000))
    workload(engine, n=4)
    engine.run(9)
    head, tail = runtime.stores("full")
    report = runtime.poll()
    assert report.violations == ()
    steps = runtime.step
    verifies = len(range(0, steps, 3))
    assert head.take_violations().kernel_runs == steps + verifies  # write + HEAD verify
    assert tail is not None and tail.take_violations().kernel_runs == steps + verifies
    assert runtime.stats.verify_steps == verifies


# --- faults ------------------------------------------------------------------------------
def _decoding(engine: FakeEngine, min_blocks: int = 2) -> Req:
    """A decoding request whose blocks no other request shares (a fault on it harms it
    alone)."""
    for req in engine.running:
        decoding = req.cached >= len(req.prompt)
        if decoding and len(req.blocks) >= min_blocks and engine.alone(req):
            return req
    raise AssertionError("no decoding request with enough blocks")


def _run_until(engine: FakeEngine, pred, limit: int = 100) -> None:
    for _ in range(limit):
        if pred(engine):
            return
        engine.step()
    raise AssertionError("the engine never reached the state the fault needs")


def _caught(engine: FakeEngine, inj: Injection, *, max_delay: int = 1):
    caught = first_catch(inj, engine.reports)
    assert caught is not None, f"{inj.kind.value} was not caught: {inj.detail}"
    assert caught.step - inj.step <= max_delay
    assert inj.victims & caught.request_ids()
    unexplained = [v.line for v in violations(engine) if not explained([inj], v)]
    assert unexplained == []
    return caught


def _engine(split: bool = False, **kwargs: object) -> FakeEngine:
    """An engine whose policy aborts the named requests; no prefix cache, so that a
    damaged block reaches no later request through a prefix hit (the stale-hit test has
    its own)."""
    kwargs.setdefault("prefix_cache", False)
    engine = FakeEngine(**kwargs)  # type: ignore[arg-type]
    engine.attach(default_config(policy=lambda ids, report: engine.abort(ids), split_write=split))
    assert engine.runtime is not None and engine.runtime.split_write is split
    workload(engine, n=8, output=16)
    return engine


@SPLIT
def test_a_page_freed_while_referenced_is_caught_in_the_step_that_reuses_it(split):
    engine = _engine(split)
    _run_until(engine, lambda e: any(r.cached > 2 * PAGE and e.alone(r) for r in e.running))
    victim = next(r for r in engine.running if r.cached > 2 * PAGE and engine.alone(r))
    block = victim.blocks[0]
    engine.force_block = (block, frozenset({victim.id}))
    step = engine.runtime.step
    _run_until(engine, lambda e: e.force_block is None)
    culprit = next(rid for rid, b in engine.allocations if b == block and rid != victim.id)
    inj = Injection(FaultKind.FREED_PAGE_REUSED, step, {victim.id}, {culprit}, "")
    engine.run(3)
    caught = _caught(engine, inj, max_delay=PAGE)
    assert caught.violation.fail_bits & (FailBits.CHAIN | FailBits.POSITION)
    assert culprit in caught.request_ids() or caught.culprit_id == culprit


@SPLIT
def test_a_page_handed_to_two_requests_is_caught_and_names_both(split):
    engine = _engine(split)
    engine.run(3)
    engine.double_alloc = []
    step = engine.runtime.step
    _run_until(engine, lambda e: e.double_alloc is None)
    assert engine.doubled is not None
    first, second, _block = engine.doubled
    owners = {first, second}
    inj = Injection(FaultKind.DOUBLE_ALLOCATION, step, owners, owners, "")
    engine.run(3)
    caught = _caught(engine, inj, max_delay=PAGE)
    assert caught.request_ids() >= owners


@SPLIT
def test_an_off_by_one_in_the_slot_mapping_is_caught_at_the_next_step(split):
    engine = _engine(split)
    _run_until(engine, lambda e: any(r.cached >= len(r.prompt) and e.alone(r) for r in e.running))
    victim = next(r for r in engine.running if r.cached >= len(r.prompt) and engine.alone(r))
    engine.slot_shift[victim.id] = 1
    step = engine.runtime.step
    engine.step()
    del engine.slot_shift[victim.id]
    engine.run(2)
    caught = _caught(engine, Injection(FaultKind.SLOT_OFF_BY_ONE, step, {victim.id}, set(), ""))
    assert caught.step == step + 1 and caught.endpoint is Endpoint.HEAD_VERIFY


@SPLIT
def test_kv_bytes_overwritten_in_a_forward_are_caught_by_that_steps_tail_verify(split):
    engine = _engine(split)
    engine.run(4)
    victim = _decoding(engine, min_blocks=1)
    slot = victim.blocks[0] * PAGE + 1

    def scribble(e: FakeEngine, batch: list[Req], out: torch.Tensor) -> None:
        e.kv.view(-1, 8)[slot, 0] += 1.0
        e.in_forward.clear()

    engine.in_forward.append(scribble)
    step = engine.runtime.step
    engine.run(3)
    caught = _caught(engine, Injection(FaultKind.KV_OVERWRITTEN, step, {victim.id}, set(), ""))
    assert caught.step == step and caught.endpoint is Endpoint.TAIL_VERIFY
    assert caught.violation.fail_bits == FailBits.REAL_KV


@SPLIT
def test_a_padding_write_on_a_live_slot_is_caught(split):
    engine = _engine(split)
    engine.run(4)
    victim = _decoding(engine, min_blocks=1)
    slot = victim.blocks[0] * PAGE

    def padding(e: FakeEngine, batch: list[Req], out: torch.Tensor) -> None:
        # the batch's padding token (not in out_cache_loc) writes its KV at a live slot
        e.kv.view(-1, 8)[slot] = torch.zeros(8)
        e.in_forward.clear()

    engine.in_forward.append(padding)
    step = engine.runtime.step
    engine.run(3)
    caught = _caught(engine, Injection(FaultKind.PADDING_WRITE, step, {victim.id}, set(), ""))
    assert caught.step == step and caught.violation.fail_bits & FailBits.REAL_KV


@SPLIT
def test_a_stale_prefix_cache_hit_is_caught_and_names_the_request_that_hit(split):
    engine = FakeEngine(stale_cache=True)
    engine.attach(default_config(policy=lambda ids, report: engine.abort(ids), split_write=split))
    shared = engine.rand_tokens(2 * PAGE)
    engine.add("first", shared + [1], 3)
    _run_until(engine, lambda e: "first" in e.finished)
    engine.add("filler", engine.rand_tokens(4 * PAGE), 3)  # reuses the freed blocks
    _run_until(engine, lambda e: e.running and e.running[0].cached >= 3 * PAGE)
    step = engine.runtime.step
    engine.add("late", shared + [2], 3)
    engine.run(4)
    inj = Injection(FaultKind.STALE_PREFIX_HIT, step, {"late"}, {"filler"}, "")
    caught = _caught(engine, inj)
    assert caught.endpoint is Endpoint.HEAD_VERIFY
    assert engine.runtime.stats.prefix_hits >= 1


@SPLIT
def test_rejected_drafts_not_rolled_back_fail_verify_token(split):
    clean = FakeEngine(speculate=2)
    clean.attach(default_config(split_write=split))
    workload(clean, n=6, output=12)
    clean.run(120)
    assert len(clean.finished) == 6 and violations(clean) == []

    engine = FakeEngine(speculate=2)
    engine.attach(default_config(policy=lambda ids, report: engine.abort(ids), split_write=split))
    workload(engine, n=6, output=12)
    engine.run(6)
    engine.rollback = False
    victims = {r.id for r in engine.running if r.cached >= len(r.prompt)}
    step = engine.runtime.step
    engine.step()
    engine.rollback = True
    engine.run(3)
    inj = Injection(FaultKind.SPECULATIVE_NOT_ROLLED_BACK, step, victims, set(), "")
    caught = _caught(engine, inj)
    assert caught.violation.fail_bits & FailBits.VERIFY_TOKEN


# --- sweep, polls, policies ------------------------------------------------------------------
def test_the_sweep_catches_damage_to_a_request_the_batches_leave_out():
    engine = FakeEngine()
    runtime = engine.attach(default_config(sweep_every=3))
    workload(engine, n=4, output=20)
    engine.run(6)
    held = _decoding(engine, min_blocks=1)
    engine.hold.add(held.id)
    engine.run(2)
    engine.kv.view(-1, 8)[held.blocks[0] * PAGE, 0] += 1.0  # between steps
    step = runtime.step
    engine.run(4)
    found = [v for v in violations(engine) if v.request_ids() & {held.id}]
    assert found and {v.endpoint for v in found} == {Endpoint.SWEEP}
    assert found[0].step >= step and found[0].violation.fail_bits == FailBits.REAL_KV


def test_a_poll_maps_old_steps_to_their_requests_and_returns_none_between_polls():
    engine = FakeEngine()
    runtime = engine.attach(default_config(poll_every=4))
    workload(engine, n=4, output=20)
    engine.run(4)
    assert len(engine.reports) == 1
    victim = _decoding(engine, min_blocks=1)
    slot = victim.blocks[0] * PAGE
    engine.in_forward.append(lambda e, batch, out: e.kv.view(-1, 8)[slot, 0].add_(1.0))
    step = runtime.step
    engine.step()  # its TAIL verify sees the damage; the poll comes 3 steps later
    engine.in_forward.clear()
    engine.abort(frozenset({victim.id}))  # released before the poll reads the rows
    engine.add("newcomer", engine.rand_tokens(6), 4)
    engine.run(3)
    assert len(engine.reports) == 2  # steps 4..7 in one poll
    named = {rid for v in engine.reports[1].violations for rid in v.request_ids()}
    assert victim.id in named and "newcomer" not in named
    assert all(v.step >= step for v in engine.reports[1].violations)


def test_log_lines_keep_sglangs_format_and_name_the_request(caplog):
    engine = _engine()
    engine.run(4)
    victim = _decoding(engine, min_blocks=1)
    engine.slot_shift[victim.id] = 1
    with caplog.at_level(logging.WARNING, logger="kv_canary"):
        engine.run(2)
    lines = [r.getMessage() for r in caplog.records if r.name == "kv_canary"]
    rows = [line for line in lines if line.startswith("kv_canary violation:")]
    names = {  # SGLang's fail_reason labels
        "verify_chain_hash",
        "verify_position",
        "verify_real_kv_hash",
        "write_token",
        "write_position",
        "verify_token",
    }
    assert rows and any(victim.id in line for line in rows)
    for line in rows:
        m = SGLANG_LINE.match(line)
        assert m, line
        step, _group, endpoint = decode_tag(int(m.group(1)))
        assert endpoint is not None and f"endpoint={endpoint.name} step={step}" in line
        assert set(m.group(2).split("+")) <= names


def test_the_raise_policy_names_the_requests():
    engine = FakeEngine()
    engine.attach(default_config(policy="raise"))
    workload(engine, n=4, output=20)
    engine.run(4)
    victim = _decoding(engine, min_blocks=1)
    engine.slot_shift[victim.id] = 1
    engine.step()
    with pytest.raises(CanaryViolationError, match=r"kv-canary: .*violation.*" + victim.id) as err:
        engine.step()
    assert victim.id in err.value.report.request_ids()


def test_the_callback_policy_aborts_the_requests_and_the_run_goes_on_clean():
    engine = _engine()
    engine.run(4)
    victim = _decoding(engine, min_blocks=1)
    engine.slot_shift[victim.id] = 1
    engine.step()
    del engine.slot_shift[victim.id]
    engine.run(200)
    assert victim.id not in engine.finished  # aborted
    assert len(engine.finished) == 7
    named = {rid for v in violations(engine) for rid in v.request_ids()}
    assert named <= {victim.id} | _neighbours(engine, victim)


def _neighbours(engine: FakeEngine, victim: Req) -> set[str]:
    """Requests that held a slot next to the victim's (its shifted write may land there)."""
    blocks = set(victim.blocks)
    return {rid for rid, b in engine.allocations if b in blocks or b - 1 in blocks}


@SPLIT
def test_the_health_check_says_when_launches_did_not_run(caplog, split):
    engine = FakeEngine()
    runtime = engine.attach(default_config(split_write=split))
    workload(engine, n=3)
    engine.run(2)
    which = "stamp" if split else "write_pair"  # the stamp counts the split write's run
    real_write = getattr(runtime.stages, which)
    object.__setattr__(runtime.stages, which, lambda *a, **k: None)  # the canary stops
    with caplog.at_level(logging.ERROR, logger="kv_canary"):
        engine.step()
    assert not runtime.health.executing
    assert "not executing" in runtime.health.message
    assert any("not executing" in r.getMessage() for r in caplog.records)
    object.__setattr__(runtime.stages, which, real_write)
    runtime.poll()
    assert runtime.health.executing


# --- growth, tables, tags ---------------------------------------------------------------------
def test_buffers_grow_from_host_numbers_and_long_prefixes_are_verified():
    engine = FakeEngine(num_blocks=200, chunk=40)
    runtime = engine.attach(default_config())
    for i in range(9):
        engine.add(f"long-{i}", engine.rand_tokens(60 + 5 * i), 8)
    engine.run(4)
    assert runtime.pool.shape[1] >= 100  # from 16 positions a row
    assert runtime.pool.shape[0] > 6  # from 2 rows
    victim = _decoding(engine, min_blocks=10)
    engine.kv.view(-1, 8)[victim.blocks[9] * PAGE, 0] += 1.0  # deep in a long prefix
    engine.run(2)
    assert {victim.id} & {r for v in violations(engine) for r in v.request_ids()}
    assert all(not flags for r in engine.reports for flags in r.plan_status.values())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_block_tables_and_token_slots_expand_to_the_same_req_to_token(dtype):
    gen = torch.Generator().manual_seed(3)
    page, rows, lengths = 4, torch.tensor([3, 1, 5]), [9, 0, 4]
    blocks = torch.randint(1, 50, (3, 3), generator=gen, dtype=dtype)
    expected = torch.full((6, 12), 7, dtype=torch.int32)
    for b, (row, length) in enumerate(zip(rows.tolist(), lengths)):
        for pos in range(length):
            expected[row, pos] = int(blocks[b, pos // page]) * page + pos % page
    a = torch.full((6, 12), 7, dtype=torch.int32)
    expand_into_req_to_token(
        a, BlockTable(table=blocks), rows=rows, lengths=lengths, page_size=page
    )
    flat = torch.cat([expected[r, :n] for r, n in zip(rows.tolist(), lengths)]).to(dtype)
    b_ = torch.full((6, 12), 7, dtype=torch.int32)
    expand_into_req_to_token(b_, TokenSlots(slots=flat), rows=rows, lengths=lengths, page_size=page)
    assert torch.equal(a, expected) and torch.equal(b_, expected)


def test_timing_measures_the_host_time_around_the_forward():
    engine = FakeEngine()
    runtime = engine.attach(default_config(timing=True))
    workload(engine, n=3)
    engine.run(5)
    assert runtime.timing is not None
    assert len(runtime.timing.host_pre_s) == len(runtime.timing.host_post_s) == runtime.step
    summary = runtime.timing.summary()
    assert summary["host_pre_us"] > 0 and summary["host_post_us"] > 0
    assert "canary_share" not in summary  # GPU events on CUDA only
    assert engine.attach(default_config()).timing is None


def test_launch_tags_round_trip():
    for step in (0, 1, 12345, 2**40):
        for group in (0, 3, 15):
            for endpoint in Endpoint:
                assert decode_tag(launch_tag(step, group, endpoint)) == (step, group, endpoint)


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(verify_every=0), "verify_every must be an integer >= 1"),
        (dict(poll_every=-1), "poll_every"),
        (dict(policy="abort"), "policy must be 'log', 'raise' or a callable"),
        (dict(stages="gpu"), "stages"),
    ],
)
def test_a_bad_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CanaryConfig(**kwargs)


@pytest.mark.parametrize("value", [1.0, True, "2", None])
def test_a_non_integer_stride_is_a_type_error(value):
    with pytest.raises(TypeError, match="kv-canary: verify_every must be an integer >= 1, got"):
        CanaryConfig(verify_every=value)


def _runtime() -> CanaryRuntime:
    group = KVGroup(name="full", num_slots=64, page_size=4)
    return CanaryRuntime(default_config(), [group], device="cpu")


def _batch(**changes: object) -> StepBatch:
    kwargs: dict[str, object] = dict(
        rows=[Row(request_id="a", prefix_len=0, extend_len=2, tokens=[5, 6])],
        tables={"full": BlockTable(table=torch.tensor([[1]]))},
        out_cache_loc={"full": torch.tensor([4, 5])},
        input_ids=torch.tensor([5, 6]),
        positions=torch.tensor([0, 1]),
    )
    kwargs.update(changes)
    return StepBatch(**kwargs)  # type: ignore[arg-type]


def test_bad_steps_are_refused_with_kv_canary_errors():
    with pytest.raises(ValueError, match="kv-canary: groups must be"):
        CanaryRuntime(default_config(), [], device="cpu")
    group = KVGroup(name="full", num_slots=64)
    with pytest.raises(ValueError, match="distinct names"):
        CanaryRuntime(default_config(), [group, group], device="cpu")
    rt = _runtime()
    with pytest.raises(RuntimeError, match="kv-canary: end_step called without begin_step"):
        rt.end_step()
    with pytest.raises(ValueError, match="kv-canary: the batch has no table"):
        rt.begin_step(_batch(tables={}))
    rt = _runtime()
    rows = [Row(request_id="a", prefix_len=0, extend_len=1, tokens=[5])] * 2
    with pytest.raises(ValueError, match="kv-canary: a request appears twice"):
        rt.begin_step(_batch(rows=rows))
    rt = _runtime()
    with pytest.raises(ValueError, match="kv-canary: request 'a': tokens holds 1 positions"):
        rt.begin_step(_batch(rows=[Row(request_id="a", prefix_len=0, extend_len=2, tokens=[5])]))
    with pytest.raises(ValueError, match="draft_len = 3 must be <= extend_len = 2"):
        Row(request_id="a", prefix_len=0, extend_len=2, tokens=[5, 6], draft_len=3)
    with pytest.raises(TypeError, match=r"kv-canary: BlockTable\.table must be a torch\.Tensor"):
        BlockTable(table=[[1]])  # type: ignore[arg-type]
    rt = _runtime()
    rt.begin_step(_batch())
    with pytest.raises(RuntimeError, match="begin_step called twice"):
        rt.begin_step(_batch())
    assert rt.end_step() is not None  # poll_every=1


@pytest.mark.parametrize(
    ("split", "overlap"), [(False, False), (True, False), (True, True), (False, True)],
    ids=["one-write", "split", "split-overlapped", "one-write-overlapped"],
)  # fmt: skip
@pytest.mark.parametrize("tables", ["block", "token"])
def test_a_short_run_with_the_triton_kernels(device, split, overlap, tables):
    # CUDA where the machine has it (the kernels compiled; with the overlap, the step's
    # preparation launched from end_step on the side stream: the same fault caught), else
    # the interpreter on CPU. Token tables with int32 inputs as transformers gives them:
    # the table load's launch also scatters the pool and widens the inputs
    token = tables == "token"
    engine = FakeEngine(
        num_blocks=24,
        device=str(device),
        tables=tables,
        input_dtype=torch.int32 if token else torch.int64,
    )
    runtime = engine.attach(
        default_config(stages="kernels", split_write=split, overlap_begin=overlap)
    )
    runtime.load_tables_on_device |= token  # (on CUDA it is already; the interpreter too)
    assert runtime.stages.name == "kernels" and runtime.split_write is split
    for i in range(3):
        engine.add(f"k{i}", engine.rand_tokens(6 + i), 3)
    engine.run(3)
    victim = _decoding(engine, min_blocks=1)
    engine.kv.view(-1, 8)[victim.blocks[0] * PAGE, 0] += 1.0
    engine.run(2)
    named = {rid for v in violations(engine) for rid in v.request_ids()}
    assert named == {victim.id}
    assert (runtime._wide is not None) is token


@pytest.mark.parametrize("slot0_real", [False, True])
def test_a_real_token_at_slot_0_is_flagged_unless_the_engine_puts_real_tokens_there(
    slot0_real,
):
    """A busy row writing slot 0 raises ``PADDING_SLOT_WRITTEN`` (a padding bug in most
    engines); an engine whose block 0 is real (transformers 5.17) declares it and the
    bit is cleared at poll rather than logged on every clean step."""
    group = KVGroup(name="full", num_slots=64, page_size=4, slot0_real=slot0_real)
    rt = CanaryRuntime(default_config(), [group], device="cpu")
    rt.begin_step(
        _batch(
            tables={"full": BlockTable(table=torch.tensor([[0]]))},
            out_cache_loc={"full": torch.tensor([0, 1])},
        )
    )
    report = rt.end_step()  # poll_every=1
    assert report is not None
    flags = report.canary_status["full/HEAD"]
    assert bool(flags & CanaryStatus.PADDING_SLOT_WRITTEN) is not slot0_real


# --- the split write's streams and steps ---------------------------------------------------
def test_the_split_write_is_auto_by_default_on_cuda_only_and_refuses_a_bad_stream():
    group = KVGroup(name="full", num_slots=64, page_size=4)
    assert CanaryConfig().split_write is None  # the split on CUDA with the kernels
    for stages in ("reference", "kernels"):  # auto: no stream to overlap on the CPU
        rt = CanaryRuntime(CanaryConfig(stages=stages, split_write=None), [group], device="cpu")
        assert not rt.split_write and rt.side_stream is None
    rt = CanaryRuntime(CanaryConfig(stages="reference", split_write=True), [group], device="cpu")
    assert rt.split_write and rt.side_stream is None  # covered on the CPU, in order
    with pytest.raises(TypeError, match=r"kv-canary: side_stream must be a torch\.cuda\.Stream"):
        CanaryRuntime(default_config(split_write=True), [group], device="cpu", side_stream=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="split_write"):
        CanaryConfig(split_write="on")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv-canary: expected_tokens must be an integer >= 0"):
        CanaryRuntime(default_config(), [group], device="cpu", expected_tokens=-1)


def test_the_split_write_grows_its_workspaces_from_host_numbers():
    engine = FakeEngine(num_blocks=200, chunk=40)
    runtime = engine.attach(default_config(split_write=True), expected_tokens=16)
    group = runtime._groups[0]
    assert group.head_ws is not None and group.tail_ws is not None
    assert group.head_ws.token_capacity == 64  # at least 64 tokens to start with
    for i in range(4):
        engine.add(f"long-{i}", engine.rand_tokens(80), 4)
    engine.run(3)
    head_ws, tail_ws = group.head_ws, group.tail_ws
    assert head_ws.token_capacity >= 160 and tail_ws.token_capacity >= 160  # 4 x 40
    assert head_ws.slot_capacity == runtime.stores("full")[0].num_slots
    engine.run(20)
    assert group.head_ws is head_ws and group.tail_ws is tail_ws  # steady: no new one
    assert violations(engine) == [] and runtime.health.executing


@SPLIT
def test_a_discarded_step_leaves_no_false_violation(split):
    # a forward that raised: its chains stand unstamped, the next step chains anew
    engine = FakeEngine()
    runtime = engine.attach(default_config(split_write=split, poll_every=1000))
    workload(engine, n=4)
    engine.run(3)
    req = engine.running[0]
    p = req.cached
    slot = req.blocks[p // PAGE] * PAGE + p % PAGE
    runtime.begin_step(
        StepBatch(
            rows=[Row(request_id=req.id, prefix_len=p, extend_len=1, tokens=req.tokens)],
            tables={"full": BlockTable(table=torch.tensor([req.blocks], dtype=torch.int32))},
            out_cache_loc={"full": torch.tensor([slot])},
            input_ids=torch.tensor(req.tokens[p : p + 1]),
            positions=torch.tensor([p]),
        )
    )
    runtime.discard_step()
    engine.run(10)
    report = runtime.poll()
    assert report.violations == () and not report.flags and runtime.health.executing


@pytest.mark.gpu
def test_the_timing_records_its_events_through_the_driver_on_cuda():
    # runs on the H200 (skipped without CUDA): every mark after the pool's events exist is
    # the driver's cuEventRecord, and the spans it times read as torch's events would
    # (each step's three spans non-negative, the forward's the step's largest)
    engine = FakeEngine(num_blocks=80, chunk=40, device="cuda")
    runtime = engine.attach(default_config(stages="kernels", timing=True))
    assert runtime.timing is not None
    for i in range(3):
        engine.add(f"t{i}", engine.rand_tokens(20 + i), 60)
    engine.run(40)  # past one harvest: its events are recorded again
    timing = runtime.timing
    spans = timing.gpu_ms()
    assert len(spans) == runtime.step == 40
    assert all(a >= 0 and b >= 0 and c >= 0 for a, b, c in spans)
    assert timing.driver_records >= 4 * runtime.step  # every mark of every step
    torch.cuda.synchronize()
    # the same spans through torch's own record (the driver call taken away)
    import kv_canary_engines.timing as timing_module

    driver = timing_module._cu_event_record
    timing_module._cu_event_record = None
    try:
        before = timing.driver_records
        engine.run(4)
        assert timing.driver_records == before and len(timing.gpu_ms()) == runtime.step
    finally:
        timing_module._cu_event_record = driver


@pytest.mark.gpu
def test_the_chains_run_on_the_side_stream_and_the_stamps_after_them_on_cuda():
    # runs on the H200 (skipped without CUDA): the default on CUDA with the kernels is the
    # split write, the chains on the runtime's side stream (or the engine's), the stamps on
    # the current stream once it waited for them, on the steps where a row writes at least
    # SPLIT_FROM_TOKENS tokens (one launch_write a store on the others, decode here); a
    # fault is caught as without the split
    engine = FakeEngine(num_blocks=40, chunk=40, device="cuda")
    runtime = engine.attach(default_config(stages="kernels", timing=True, split_write=None))
    assert runtime.split_write and runtime.side_stream is not None
    assert runtime.overlap_begin  # the default on CUDA with the kernels
    assert runtime.split_from_tokens == SPLIT_FROM_TOKENS
    seen: list[tuple[str, int]] = []

    def spy(name: str) -> None:
        real = getattr(runtime.stages, name)

        def call(*args: object, **kwargs: object) -> None:
            seen.append((name, torch.cuda.current_stream().cuda_stream))
            real(*args, **kwargs)

        object.__setattr__(runtime.stages, name, call)

    for name in ("chain", "stamp", "write_pair"):
        spy(name)
    for i in range(3):
        engine.add(f"g{i}", engine.rand_tokens(20 + i), 6)  # one prefill step of 20 to 22
    engine.run(3)
    main = torch.cuda.current_stream().cuda_stream
    names = [n for n, _ in seen]
    assert runtime.side_stream.cuda_stream != main
    assert {s for n, s in seen if n == "chain"} == {runtime.side_stream.cuda_stream}
    assert {s for n, s in seen if n in ("stamp", "write_pair")} == {main}
    assert names.count("chain") == names.count("stamp") > 0  # the prefill step
    assert names.count("write_pair") > 0  # the decode steps (HEAD and TAIL, one launch)
    victim = _decoding(engine, min_blocks=1)
    engine.kv.view(-1, 8)[victim.blocks[0] * PAGE, 0] += 1.0
    engine.run(2)
    assert {rid for v in violations(engine) for rid in v.request_ids()} == {victim.id}
    assert runtime.timing is not None  # the chains' GPU time on the side stream, per step
    chains = runtime.timing.chain_gpu_ms()
    assert 0 < len(chains) < runtime.step and all(ms > 0 for ms in chains)
    given = torch.cuda.Stream()
    other = FakeEngine(num_blocks=24, device="cuda")
    split = default_config(stages="kernels", split_write=None)
    assert other.attach(split, side_stream=given).side_stream is given


@pytest.mark.parametrize("fault", [None, "off_by_one"])
@pytest.mark.parametrize("inputs", [torch.int64, torch.int32])
def test_the_device_table_load_leaves_what_the_torch_scatter_leaves(fault, inputs):
    # TokenSlots tables loaded from the rows' starts (launch_load_token_slots on CUDA; its
    # reference here), with the pool's updates and (int32 inputs, as transformers gives
    # them) the inputs' widening on the same launch, against the staged per-token scatter,
    # the pool's index_put_ and the cast: the same tables, pool, records, report lines and
    # tokens, sweeps included
    seen = []
    for on_device in (False, True):
        engine = FakeEngine(tables="token", input_dtype=inputs)
        runtime = engine.attach(default_config(sweep_every=4, verify_every=2))
        runtime.load_tables_on_device = on_device
        victim, final = _faulted_run(engine, runtime, fault)
        lines = [v.line for v in violations(engine)] + [v.line for v in final.violations]
        g = runtime._groups[0]
        seen.append((lines, _store_state(runtime), engine.finished, g.req_to_token.clone()))
        seen[-1] += (runtime.pool.clone(),)
        # the widening ran on the load's launch exactly where the inputs needed a cast
        assert (runtime._wide is not None) is (on_device and inputs == torch.int32)
    assert seen[0][:3] == seen[1][:3]
    assert torch.equal(seen[0][3], seen[1][3])
    assert torch.equal(seen[0][4], seen[1][4])
    assert bool(seen[0][0]) is (fault is not None)
    if fault is not None:
        assert any(f"request_id={victim.id}" in line for line in seen[1][0])


@pytest.mark.parametrize("bad", ["table on another device", "short input_ids", "short tokens"])
def test_a_rejected_batch_changes_nothing(bad):
    # every check of a batch runs before the canary writes anything: no row assigned, no
    # pool or table entry, no count; the same batch made right then runs clean
    runtime = CanaryRuntime(
        default_config(poll_every=1),
        [KVGroup(name="full", num_slots=64, page_size=4)],
        device="cpu",
    )
    runtime.load_tables_on_device = True  # (the CUDA path's staging, its reference load)
    slots = torch.arange(4, 9, dtype=torch.int64)
    given_ids = torch.tensor([11, 12, 13, 14, 15])

    def batch(slots=slots, ids=given_ids, tokens=(11, 12, 13, 14, 15)):
        return StepBatch(
            rows=[Row(request_id="a", prefix_len=0, extend_len=5, tokens=tokens)],
            tables={"full": TokenSlots(slots=slots)},
            out_cache_loc={"full": slots},
            input_ids=ids,
            positions=torch.arange(5),
        )

    wrong = {
        "table on another device": dict(slots=torch.arange(5, device="meta")),
        "short input_ids": dict(ids=torch.tensor([11, 12])),
        "short tokens": dict(tokens=(11, 12)),
    }[bad]
    pool = runtime.pool.clone()
    table = runtime._groups[0].req_to_token.clone()
    with pytest.raises((ValueError, TypeError), match="kv-canary: "):
        runtime.begin_step(batch(**wrong))
    assert runtime.live_requests() == frozenset()
    assert runtime.stats.steps == 0
    assert torch.equal(runtime.pool, pool)
    assert torch.equal(runtime._groups[0].req_to_token, table)
    runtime.discard_step()
    runtime.begin_step(batch())
    report = runtime.end_step()
    assert report is not None and not report.violations
    assert runtime.live_requests() == frozenset({"a"})


@pytest.mark.parametrize("prefix", [0, 2])  # 2: a prefix hit, whose tokens fill the pool
def test_a_token_id_past_int32_is_refused_before_anything_is_written(prefix):
    runtime = CanaryRuntime(
        default_config(poll_every=1),
        [KVGroup(name="full", num_slots=64, page_size=4)],
        device="cpu",
    )
    tokens = [11, 12, 13, 14, 15]
    tokens[0 if prefix else 4] = 2**31  # in the prefix's gap, or among the step's tokens
    slots = torch.arange(4, 9, dtype=torch.int64)
    pool = runtime.pool.clone()
    with pytest.raises(ValueError, match=r"kv-canary: request 'a': Row.tokens must be int32"):
        runtime.begin_step(
            StepBatch(
                rows=[Row(request_id="a", prefix_len=prefix, extend_len=5 - prefix, tokens=tokens)],
                tables={"full": TokenSlots(slots=slots)},
                out_cache_loc={"full": slots[prefix:]},
                input_ids=torch.tensor(tokens[prefix:]),
                positions=torch.arange(prefix, 5),
            )
        )
    assert runtime.live_requests() == frozenset() and runtime.stats.steps == 0
    assert torch.equal(runtime.pool, pool)


def test_the_refused_token_names_the_request_that_gave_it():
    # a holds 2**31 at a position this step does not read; b's step token is 2**31
    runtime = CanaryRuntime(
        default_config(poll_every=1),
        [KVGroup(name="full", num_slots=64, page_size=4)],
        device="cpu",
    )
    slots = torch.arange(4, 8, dtype=torch.int64)
    batch = StepBatch(
        rows=[
            Row(request_id="a", prefix_len=0, extend_len=2, tokens=[1, 2, 2**31]),
            Row(request_id="b", prefix_len=0, extend_len=2, tokens=[3, 2**31]),
        ],
        tables={"full": TokenSlots(slots=slots)},
        out_cache_loc={"full": slots},
        input_ids=torch.tensor([1, 2, 3, 2**31]),
        positions=torch.tensor([0, 1, 0, 1]),
    )
    with pytest.raises(ValueError, match=r"kv-canary: request 'b': Row.tokens must be int32"):
        runtime.begin_step(batch)
    # without the pool the staging's int64 holds it: accepted
    relaxed = CanaryRuntime(
        default_config(poll_every=1, check_tokens=False),
        [KVGroup(name="full", num_slots=64, page_size=4)],
        device="cpu",
    )
    relaxed.begin_step(batch)
    relaxed.end_step()
    # past int64 even the staging cannot hold it: refused, naming the request (the step's
    # tokens are checked as an array there, which such a token cannot become)
    wide = StepBatch(
        rows=[
            Row(request_id="a", prefix_len=0, extend_len=2, tokens=[1, 2]),
            Row(request_id="b", prefix_len=0, extend_len=2, tokens=[3, 2**63]),
        ],
        tables={"full": TokenSlots(slots=slots)},
        out_cache_loc={"full": slots},
        input_ids=torch.tensor([1, 2, 3, 4]),
        positions=torch.tensor([0, 1, 0, 1]),
    )
    with pytest.raises(ValueError, match=r"kv-canary: request 'b': Row.tokens must be int64"):
        relaxed.begin_step(wide)
    assert relaxed.stats.steps == 1


def test_a_decode_row_whose_tokens_stop_short_is_refused_by_name():
    # every row one token (the decode path indexes each row's tokens): a row without its
    # step's token is named as on the sliced path
    rt = _runtime()
    rows = [
        Row(request_id="a", prefix_len=0, extend_len=1, tokens=[5]),
        Row(request_id="b", prefix_len=1, extend_len=1, tokens=[7]),
    ]
    with pytest.raises(ValueError, match=r"kv-canary: request 'b': tokens holds 1 positions, "):
        rt.begin_step(_batch(rows=rows))
    assert rt.stats.steps == 0 and rt.live_requests() == frozenset()


@pytest.mark.parametrize("kind", [list, tuple, np.array, torch.tensor])
def test_a_prefix_gap_reads_tokens_of_any_sequence(kind):
    # a request first seen with a cached prefix: its gap's tokens fill the pool, read from
    # whatever sequence Row.tokens is (not only lists)
    runtime = CanaryRuntime(
        default_config(poll_every=1, real_kv=RealKVMode.NONE),
        [KVGroup(name="full", num_slots=64, page_size=4)],
        device="cpu",
    )
    slots = torch.arange(4, 9, dtype=torch.int64)
    runtime.begin_step(
        StepBatch(
            rows=[
                Row(request_id="a", prefix_len=2, extend_len=3, tokens=kind([11, 12, 13, 14, 15]))
            ],
            tables={"full": TokenSlots(slots=slots)},
            out_cache_loc={"full": slots[2:]},
            input_ids=torch.tensor([13, 14, 15]),
            positions=torch.arange(2, 5),
        )
    )
    runtime.end_step()
    row = runtime.rows.row_of("a")
    assert runtime.pool[row, :5].tolist() == [11, 12, 13, 14, 15]


def test_the_widened_inputs_buffer_grows_and_keeps_its_views_while_n_repeats():
    # the runtime's int64 [2, >= n] buffer the table load widens into: even rows (the
    # second row 16-byte aligned as the first), grown by doubling when a step needs more,
    # its first n columns kept as views while n repeats and rebuilt when n changes
    runtime = CanaryRuntime(
        default_config(), [KVGroup(name="full", num_slots=64, page_size=4)], device="cpu"
    )
    wide, views = runtime._wide_inputs(5)
    assert wide.dtype == torch.int64 and wide.shape[0] == 2 and wide.shape[1] >= 5
    assert wide.shape[1] % 2 == 0
    assert views["input_ids"].data_ptr() == wide[0].data_ptr()
    assert views["positions"].data_ptr() == wide[1].data_ptr()
    assert views["input_ids"].shape == views["positions"].shape == (5,)
    again, same = runtime._wide_inputs(5)
    assert again is wide and same is views  # n repeats: nothing rebuilt
    fewer, cut = runtime._wide_inputs(3)
    assert fewer is wide and cut["input_ids"].shape == (3,)
    grown, big = runtime._wide_inputs(wide.shape[1] + 1)
    assert grown is not wide and grown.shape[1] >= 2 * wide.shape[1]
    assert big["positions"].data_ptr() == grown[1].data_ptr()
    assert big["positions"].shape == (wide.shape[1] + 1,)


@pytest.mark.parametrize("tail", [True, False])
def test_the_head_and_tail_writes_are_one_call_and_a_head_alone_one_write(tail):
    # with a TAIL store a step's two writes are one write_pair call (one launch with the
    # kernels); without one the HEAD write is launch_write's; a fault is caught either way
    engine = FakeEngine(num_blocks=60)
    runtime = engine.attach(default_config(tail=tail, split_write=False))
    calls: list[str] = []
    for name in ("write", "write_pair"):
        real = getattr(runtime.stages, name)

        def call(*args: object, _name: str = name, _real=real, **kwargs: object) -> None:
            calls.append(_name)
            _real(*args, **kwargs)

        object.__setattr__(runtime.stages, name, call)
    workload(engine, n=3)
    engine.run(3)
    victim = _decoding(engine, min_blocks=1)
    engine.kv.view(-1, 8)[victim.blocks[0] * PAGE, 0] += 1.0
    engine.run(3)
    assert calls == ["write_pair" if tail else "write"] * runtime.step
    assert (runtime.stores("full")[1] is None) is not tail
    assert {rid for v in violations(engine) for rid in v.request_ids()} == {victim.id}
