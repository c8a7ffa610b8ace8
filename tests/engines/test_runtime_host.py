"""The runtime's host work per step, guarded structurally (no wall clock): on a
transformers-shaped workload (``benchmarks.probes.runtime_host``'s simulation, launches
replaced by counters), every step after the first makes no read back to the host, builds
no tensor from a Python list, stages its host arrays once, and makes the same bounded number
of torch calls whatever its rows and tokens (no torch work per row or per token). Plus
:func:`kv_canary_engines.host.to_device` itself, and int64 slots that would wrap onto a
real slot in int32."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

import kv_canary_engines.runtime as runtime_module
from benchmarks.probes import runtime_host
from kv_canary_buffers import RealKVMode, verify_entries_needed
from kv_canary_engines import BlockTable, CanaryConfig, Row, StepBatch, TokenSlots
from kv_canary_engines.host import to_device
from tests.engines.fake_engine import FakeEngine, default_config

MOST_TORCH_CALLS = 64
"""Torch calls of one step (``begin_step`` + ``end_step``, launches excluded), measured
at 61 (TokenSlots, HEAD + TAIL, pool on, int32 ``input_ids`` and ``positions`` as rows of
one tensor, as transformers gives them: their one cast's storage checks, strided view,
allocation and slices are about 20 of them; int64 inputs, which need no cast, made 40
to 42): slicing the staged views, the pool's and the table's scatters, the per-token inputs'
dtype checks. Before the host arrays were staged in one copy a decode step made 48 with
int64 inputs and a prefill step 239 (its lists turned into tensors, the tables expanded
per token with repeat_interleave)."""


def _args(**changes: object) -> argparse.Namespace:
    args = runtime_host.parse(["--requests", "12", "--prompt", "40", "--generate", "6"])
    args.max_batch_tokens, args.page_size, args.poll_every = 64, 16, 1000
    for k, v in changes.items():
        setattr(args, k, v)
    return args


def _steps_of(args: argparse.Namespace) -> list[runtime_host.StepTimes]:
    steps = runtime_host.workload(args, torch.device("cpu"))
    times, stages, _ = runtime_host.run(
        "kv_canary_engines", steps, args, torch.device("cpu"), count=True
    )
    assert stages.calls["plan"] == len(steps)  # the counters stood in for every launch
    split = args.split_write == "on"
    # a write a store a step: the pair's one call for both stores, or the split write's
    # chain and stamp a store
    assert stages.calls["write"] == 0
    assert stages.calls["write_pair"] == (0 if split else len(steps))
    assert stages.calls["chain"] == stages.calls["stamp"] == (2 * len(steps) if split else 0)
    assert stages.calls["verify"] == 2 * len(steps)  # HEAD and TAIL, every step
    return times


SPLIT = pytest.mark.parametrize("split", ["off", "on"])
"""``--split-write``: the write in one call, or split (the runtime's default on CUDA)."""


@SPLIT
@pytest.mark.parametrize("stages", ["noop", "validate"])
def test_a_step_reads_nothing_back_and_builds_no_tensor_from_a_list(split, stages):
    times = _steps_of(_args(split_write=split, stages=stages))
    kinds = {t.kind for t in times}
    assert kinds == {"prefill", "decode"}
    for t in times[1:]:  # the first step builds the runtime's buffers
        assert t.reads == 0, t
        assert t.from_python == 0, t
        assert t.moves == 0, t  # on the CPU the staged buffer is the tensor itself


@SPLIT
def test_the_torch_calls_of_a_step_do_not_grow_with_its_rows_or_tokens(split):
    times = [t for t in _steps_of(_args(split_write=split))[1:] if not t.polled]
    # buffers grow on a few early steps (a new PlanBuffers allocates): leave those out by
    # taking the most common count, which every other step must not exceed
    counts = sorted(t.ops for t in times)
    common = max(set(counts), key=counts.count)
    assert common <= MOST_TORCH_CALLS
    steady = [t for t in times if t.ops <= common]
    assert len(steady) >= len(times) - 6
    rows = {t.rows for t in steady}
    tokens = {t.tokens for t in steady}
    assert len(rows) > 3 and max(tokens) > 8 * min(tokens)  # the sizes did vary
    assert {t.ops for t in steady} == {common}


@pytest.mark.parametrize("tables", ["block", "token"])
def test_a_step_stages_its_host_arrays_in_one_copy(monkeypatch, tables):
    # every step stages once: a new layout through to_device, a repeated one (decode
    # steps of an unchanged batch) into the kept buffer; a TokenSlots step's layout
    # repeats when its table loads from the rows' starts (as on CUDA), not per token
    import kv_canary_engines.host as host_module

    calls = []

    def counted(arrays, device):
        calls.append(len(arrays))
        return to_device(arrays, device)

    monkeypatch.setattr(host_module, "to_device", counted)
    engine = FakeEngine(tables=tables)
    engine.attach(default_config(sweep_every=0)).load_tables_on_device = True
    engine.add("a", list(range(1, 12)), 4)
    engine.add("b", list(range(20, 29)), 4)
    engine.run(6)
    staging = engine.runtime._staging
    assert calls and len(calls) + staging.reused == engine.runtime.stats.steps
    assert staging.reused >= 1  # the decode steps of the two requests
    assert not any(v for r in engine.reports for v in r.violations)


def test_write_only_steps_plan_without_verify_entries():
    engine = FakeEngine()
    runtime = engine.attach(default_config(verify_every=3))
    seen = []
    plan = runtime.stages.plan

    def spy(buffers, **kwargs):
        seen.append(kwargs["verify"])
        plan(buffers, **kwargs)

    object.__setattr__(runtime.stages, "plan", spy)
    engine.add("a", list(range(1, 12)), 6)
    engine.run(7)
    assert seen[:7] == [True, False, False, True, False, False, True]
    assert not any(v for r in engine.reports for v in r.violations)


@pytest.mark.parametrize("window", [0, 3])
def test_the_verify_entries_the_runtime_counts_match_the_library(window):
    gen = np.random.default_rng(0)
    for _ in range(50):
        prefix = gen.integers(0, 40, size=int(gen.integers(0, 9)))
        assert runtime_module._verify_entries(prefix, window) == verify_entries_needed(
            prefix.tolist(), swa_window_size=window
        )


def test_staging_reuses_its_buffer_only_for_the_same_layout():
    from kv_canary_engines.host import Staging

    staging = Staging(torch.device("cpu"))
    first = [np.arange(3, dtype=np.int64), np.arange(5, dtype=np.int32) + 7]
    views = staging.stage(first)
    second = [a * 3 for a in first]
    again = staging.stage(second)  # the same sizes and dtypes: the same views, new values
    assert staging.reused == 1 and all(a is b for a, b in zip(views, again))
    assert [v.tolist() for v in again] == [a.tolist() for a in second]
    other = staging.stage([np.arange(4, dtype=np.int64), np.arange(5, dtype=np.int32)])
    assert staging.reused == 1 and other[0] is not views[0]  # another layout: staged anew
    assert [v.tolist() for v in other] == [[0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert [v.data_ptr() % 16 for v in other] == [0, 0]


def test_to_device_keeps_values_and_aligns_each_array():
    arrays = [
        np.arange(3, dtype=np.int64),
        np.array([7], dtype=np.int32),
        np.array([], dtype=np.int64),
        np.arange(5, dtype=np.int32) - 2,
        np.array([2**40, -(2**40)], dtype=np.int64),
    ]
    out = to_device(arrays, torch.device("cpu"))
    base = out[0].data_ptr()
    for a, t in zip(arrays, out):
        assert t.dtype == (torch.int32 if a.dtype == np.int32 else torch.int64)
        assert t.tolist() == a.tolist()
        assert (t.data_ptr() - base) % 16 == 0
    with pytest.raises(TypeError, match="kv-canary: to_device takes 1-D int64 or int32"):
        to_device([np.zeros((2, 2), dtype=np.int64)], torch.device("cpu"))


@pytest.mark.parametrize("kind", ["block", "token"])
def test_int64_slots_past_int32_are_flagged_not_wrapped_onto_a_real_slot(kind):
    # A table entry 2**32 past a real slot wraps onto that slot in int32 and would verify
    # it. The references refuse what the kernels flag (a CanaryStatus bit): the verify
    # must see a slot outside the store, exactly (block: the plan's int64 slot) or
    # saturated (token slots: int32's largest).
    engine = FakeEngine(tables=kind)
    runtime = engine.attach(default_config(poll_every=1))
    engine.add("a", list(range(1, 10)), 3)
    engine.run(3)
    req = engine.running[0]
    p = req.cached
    real = [req.blocks[q // 4] * 4 + q % 4 for q in range(p + 1)]
    if kind == "block":
        blocks = torch.tensor([req.blocks], dtype=torch.int64)
        blocks[0, 0] += 2**30  # x page_size 4: 2**32 past the real slot
        table: BlockTable | TokenSlots = BlockTable(table=blocks)
        bad = real[0] + 2**32
    else:
        slots = torch.tensor(real, dtype=torch.int64)
        slots[0] += 2**32
        table = TokenSlots(slots=slots)
        bad = 2**31 - 1
    batch = StepBatch(
        rows=[Row(request_id=req.id, prefix_len=p, extend_len=1, tokens=req.tokens)],
        tables={"full": table},
        out_cache_loc={"full": torch.tensor(real[p:], dtype=torch.int64)},
        input_ids=torch.tensor(req.tokens[p : p + 1], dtype=torch.int64),
        positions=torch.tensor([p], dtype=torch.int64),
    )
    with pytest.raises(ValueError, match=rf"verify_slot_indices\[0\] = {bad} must be in \[0, "):
        runtime.begin_step(batch)


def test_config_is_unchanged_by_the_host_work():
    # the staged path serves every option the config has (pool off, no TAIL)
    for changes in ({"check_tokens": False}, {"tail": False}):
        engine = FakeEngine(tables="token")
        engine.attach(CanaryConfig(stages="reference", **changes))  # type: ignore[arg-type]
        engine.add("a", list(range(1, 12)), 4)
        engine.run(6)
        assert not any(v for r in engine.reports for v in r.violations)


@pytest.mark.parametrize("kind", [list, tuple, np.array, torch.tensor])
def test_row_tokens_may_be_any_sequence(kind):
    # Row.tokens is any sequence: lists, tuples, numpy arrays, tensors all stage the same
    from kv_canary_engines import CanaryRuntime, KVGroup

    runtime = CanaryRuntime(
        CanaryConfig(stages="reference", real_kv=RealKVMode.NONE, poll_every=1),
        [KVGroup(name="full", num_slots=64, page_size=4)],
        device="cpu",
    )
    tokens = kind([11, 12, 13, 14, 15])
    for p, e in ((0, 4), (4, 1)):
        slots = torch.arange(4, 4 + p + e, dtype=torch.int64)
        runtime.begin_step(
            StepBatch(
                rows=[Row(request_id="a", prefix_len=p, extend_len=e, tokens=tokens)],
                tables={"full": TokenSlots(slots=slots)},
                out_cache_loc={"full": slots[p:]},
                input_ids=torch.tensor([11, 12, 13, 14, 15][p : p + e]),
                positions=torch.arange(p, p + e),
            )
        )
        report = runtime.end_step()
        assert report is not None and not report and not report.flags


@pytest.mark.parametrize("kind", ["block", "token"])
def test_the_fallback_attribution_reads_the_table_each_row_last_filled(kind):
    # block-table steps fill the runtime's block table, token steps req_to_token: the
    # holders of a slot come from the table of each row's last step
    engine = FakeEngine(tables=kind)
    runtime = engine.attach(default_config(poll_every=1000))
    engine.add("a", list(range(1, 12)), 3)
    engine.add("b", list(range(20, 30)), 3)
    engine.run(3)
    holders = runtime_module._SlotHolders(runtime)
    group = runtime._groups[0]
    assert group.by_blocks and set(group.by_blocks.values()) == {kind == "block"}
    for req in engine.running:
        slot = req.blocks[1] * 4 + 1
        assert holders.of(group, runtime.step - 1, slot) == (req.id,)
    assert holders.of(group, runtime.step - 1, 0) == ()


@pytest.mark.parametrize(
    "case, paired",
    [
        ("rows of one tensor", True),  # transformers: input_ids and positions in one int32
        ("reversed rows", True),
        ("overlapping", False),
        ("two tensors", False),
        ("int64", False),
    ],
)
def test_input_ids_and_positions_cast_once_where_they_share_a_tensor(case, paired):
    from kv_canary_engines.runtime import _flat_inputs

    bulk = torch.arange(40, dtype=torch.int32).view(4, 10)
    n = 5
    ids, pos = {
        "rows of one tensor": (bulk[0, :6].unsqueeze(0), bulk[1, :6].unsqueeze(0)),
        "reversed rows": (bulk[2, :n], bulk[0, :n]),
        "overlapping": (bulk[0, :8], bulk[0, 2:10]),
        "two tensors": (bulk[0], torch.arange(10, dtype=torch.int32)),
        "int64": (torch.arange(8), torch.arange(8) + 3),
    }[case]
    out = _flat_inputs(ids, pos, n)
    a, b = out["input_ids"], out["positions"]
    assert a.dtype == b.dtype == torch.int64 and a.is_contiguous() and b.is_contiguous()
    if paired:  # (n is odd: the second row still starts 16-byte aligned)
        assert a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    assert a.tolist() == ids.reshape(-1)[:n].tolist()
    assert b.tolist() == pos.reshape(-1)[:n].tolist()
    if case == "int64":  # no cast: views of the tensors themselves
        assert a.data_ptr() == ids.data_ptr() and b.data_ptr() == pos.data_ptr()
    else:  # one cast: both rows of one new tensor
        assert (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()) is paired


def test_the_probe_runs_the_cuda_table_load_and_thrashes_between_steps():
    # --device-tables: every TokenSlots step loads its table from the rows' starts (the
    # CUDA path, its stand-in counted); --thrash: the caches evicted before each step
    args = _args(device_tables=True, thrash=1)
    steps = runtime_host.workload(args, torch.device("cpu"))
    times, stages, _ = runtime_host.run("kv_canary_engines", steps, args, torch.device("cpu"))
    assert stages.calls["load_slots"] == len(steps) == len(times)
    thrasher = runtime_host.Thrasher(1)
    before = bytes(thrasher._bytes[:256])
    thrasher()
    assert bytes(thrasher._bytes[:256]) != before  # it wrote every cache line


def test_staging_takes_lists_with_their_kinds():
    from kv_canary_engines.host import Staging

    staging = Staging(torch.device("cpu"))
    first = staging.stage([[1, 2, 3], [7, 8, 9]], "qi")
    assert [v.dtype for v in first] == [torch.int64, torch.int32]
    again = staging.stage([[4, 5, 6], [1, -2, 2**31 - 1]], "qi")  # the same layout: reused
    assert staging.reused == 1 and again[0] is first[0]
    assert [v.tolist() for v in again] == [[4, 5, 6], [1, -2, 2**31 - 1]]
    # the same sizes as numpy arrays are the same layout too
    arrays = [np.array([7, 7, 7], dtype=np.int64), np.array([3, 3, 3], dtype=np.int32)]
    assert [v.tolist() for v in staging.stage(arrays)] == [[7, 7, 7], [3, 3, 3]]
    assert staging.reused == 2
    with pytest.raises(ValueError, match=r"kv-canary: Staging\.stage kinds must be q or i"):
        staging.stage([[1], [2]], "qf")
