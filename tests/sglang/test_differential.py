"""This project against SGLang 0.5.23's own torch references: plan, write and verify.

SGLang's references are downloaded at run time (``fetch_sglang.py``, a pinned wheel, into a
cache outside the repository) and imported alone (``sglang_refs.py``), by the session
fixture ``refs`` (``tests/sglang/conftest.py``); none of SGLang's code is in this repository.
The tests are skipped only when that download fails (no network), with the reason; with
``KV_CANARY_REQUIRE_SGLANG=1`` (CI) a failed download fails them.

- ``test_plan_*``: generated batches (padding rows, prefix and extend lengths, SWA windows
  and LUTs, an expected-token pool with valid lengths and offsets, overflowing capacities):
  ``plan_reference`` and ``launch_plan`` field by field against SGLang's ``plan_ref``.
- ``test_pipeline_*``: engine-shaped runs (``sglang_diff.run_scenario``) in real-KV modes
  NONE, PARTIAL and ALL, clean and with seven kinds of corruption: every plan, write and
  verify call of both paths compared with SGLang's (records byte for byte, violation rows,
  counts, counters).
- ``test_store_*``: a store written by SGLang checked here, and one written here checked by
  SGLang (SGLang's verify reading this project's ``PlanBuffers`` as its ``VerifyPlan``).
- ``test_differs_*``: each deliberate difference (``docs/porting-sglang.md``, "Where this
  project deliberately differs"), shown on both sides: the inputs the differential tests
  above keep out.
- ``test_per_source_geometry_*``: SGLang's per-source real-KV geometry (sources of
  different page sizes, token widths and read widths in one launch), as ``RealKVSource``
  objects and, for the harness, as plain tensors of one geometry.
"""

from __future__ import annotations

import pytest
import torch

from kv_canary_buffers import (
    CanaryStatus,
    CanaryStore,
    PlanBuffers,
    PlanStatus,
    RealKV,
    RealKVMode,
    RealKVSource,
    plan_reference,
    verify_reference,
    write_reference,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from tests.sglang import sglang_diff as diff

I64, I32, U8 = torch.int64, torch.int32, torch.uint8


# --- plan ---------------------------------------------------------------------------
PLAN_SPECS = [
    diff.Spec(seed=1000 + i, swa=i % 3 == 1, pool=i % 4 != 3, overflow=i % 7 == 6, holes=i % 5 == 2)
    for i in range(48)
]


@pytest.mark.parametrize("spec", PLAN_SPECS, ids=str)
def test_plan_matches_sglang_plan_ref(refs, spec):
    entries, overflowed = diff.run_plan_only(refs, spec)
    assert overflowed == (spec.overflow and entries > 1)


def test_plan_specs_cover_entries_and_overflow(refs):
    """The generated plans are not vacuous: most have entries, some overflow."""
    results = [diff.run_plan_only(refs, spec) for spec in PLAN_SPECS[:16]]
    assert sum(entries > 0 for entries, _ in results) >= 12
    assert any(overflowed for _, overflowed in results)


# --- the pipeline -------------------------------------------------------------------
PIPELINE_SPECS = [
    diff.Spec(seed=2000 + 10 * mode + i, mode=mode, swa=i % 2 == 1, corruption=kind)
    for mode in (0, 1, 2)
    for i, kind in enumerate(diff.CORRUPTIONS)
] + [
    diff.Spec(seed=2100, mode=1, corruption="input", expected_inputs=False),
    diff.Spec(seed=2101, mode=2, corruption="input", chain_check=False),
    diff.Spec(seed=2102, mode=0, corruption="input", expected_inputs=False, chain_check=False),
    diff.Spec(seed=2103, mode=1, corruption="pool", pool=False),
    diff.Spec(seed=2104, mode=2, swa=True, corruption="record", overflow=True),
    diff.Spec(seed=2105, mode=1, corruption="reuse", ring=2),
    diff.Spec(seed=2106, mode=0, swa=True, corruption="skip", ring=3),
    diff.Spec(seed=2107, mode=2, corruption="kv", ring=1),
]


@pytest.mark.parametrize("spec", PIPELINE_SPECS, ids=str)
def test_pipeline_matches_sglang(refs, spec):
    """Every call of both paths equals SGLang's (``run_scenario`` asserts after each); and
    the run is not vacuous: a clean run reports nothing, a corruption every verify must
    see is reported."""
    out = diff.run_scenario(refs, spec)
    assert out.verify_entries > 0 or out.overflowed
    if out.kind == "none":
        assert out.violations == 0, "a clean run reported violations"
    if out.caught:
        assert out.violations > 0, f"corruption {out.kind} went unreported on every side"


# --- stores interchanged ----------------------------------------------------------------
def _flip_a_verified_position(store_records: torch.Tensor, slots: torch.Tensor) -> int:
    s = int(slots[slots > 0][0])
    store_records[s, 1] ^= 1 << 20
    return s


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["NONE", "PARTIAL", "ALL"])
@pytest.mark.parametrize("corrupt", [False, True], ids=["clean", "corrupted"])
def test_store_written_by_sglang_verifies_here(refs, mode, corrupt):
    """SGLang's ``canary_buf`` copied into a ``CanaryStore``: this project's verify (both
    paths) reports what SGLang's own verify reports: nothing on a clean run."""
    out = diff.run_scenario(refs, diff.Spec(seed=3000 + mode, mode=mode, swa=mode == 1))
    sg, ours = out.stores["sglang"], out.stores["reference"]
    assert out.violations == 0
    buf = sg.buf.clone()
    plan = ours.plan_buffers  # the decode plan, equal to SGLang's (compared in the run)
    if corrupt:
        _flip_a_verified_position(
            buf.view(I64), plan.verify_slot_indices[: int(plan.verify_num_valid)]
        )
    # SGLang's own verify of its (corrupted) buffer.
    sg.buf.copy_(buf)
    sg.ring.zero_()
    sg.write_index.zero_()
    sg.verify(5, True, True)
    expected = sg.rows(0, int(sg.write_index))
    for verify in (verify_reference, launch_verify):
        store = CanaryStore.allocate(num_slots=buf.shape[0], violation_capacity=64, device="cpu")
        store.records.view(U8).copy_(buf)  # SGLang's canary_buf: the same bytes
        verify(store, plan, launch_tag=5, real_kv=ours.real_kv)
        report = store.take_violations()
        got = [
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
        assert sorted(got) == sorted(expected), verify.__name__
        assert (len(got) > 0) == corrupt


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["NONE", "PARTIAL", "ALL"])
@pytest.mark.parametrize("corrupt", [False, True], ids=["clean", "corrupted"])
@pytest.mark.parametrize("writer", ["reference", "kernels"])
def test_store_written_here_verifies_in_sglang(refs, mode, corrupt, writer):
    """Records this project wrote, copied into a ``canary_buf``, verified by SGLang's
    verify reading this project's ``PlanBuffers`` (its fields are SGLang's ``VerifyPlan``
    fields, same dtypes and shapes): SGLang reports what this project reports."""
    out = diff.run_scenario(refs, diff.Spec(seed=3100 + mode, mode=mode, swa=mode == 2))
    ours, sg = out.stores[writer], out.stores["sglang"]
    assert out.violations == 0
    plan = ours.plan_buffers
    records = ours.store.records.clone()
    if corrupt:
        _flip_a_verified_position(records, plan.verify_slot_indices[: int(plan.verify_num_valid)])
    store = CanaryStore.allocate(num_slots=records.shape[0], violation_capacity=64, device="cpu")
    store.records.copy_(records)
    verify_reference(store, plan, launch_tag=7, real_kv=ours.real_kv)
    mine = store.take_violations()
    as_verify_plan = refs.verify.VerifyPlan(
        verify_slot_indices=plan.verify_slot_indices,
        verify_expected_tokens=plan.verify_expected_tokens,
        verify_expected_positions=plan.verify_expected_positions,
        verify_prev_slot_indices=plan.verify_prev_slot_indices,
        verify_num_valid=plan.verify_num_valid,
        enable=plan.verify_enable,
    )
    sg.buf.copy_(records.view(U8))
    sg.ring.zero_()
    sg.write_index.zero_()
    refs.verify_ref(
        context=sg.context(7, True), plan=as_verify_plan, check_verify_expected_token=True
    )
    theirs = sg.rows(0, int(sg.write_index))
    assert [tuple(int(x) for x in row) for row in theirs] == [
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
        for v in mine.violations
    ]
    assert (len(theirs) > 0) == corrupt


# --- deliberate differences ---------------------------------------------------------------
# Each test feeds one input the differential tests keep out and shows what each side does.
# docs/porting-sglang.md, "Where this project deliberately differs", lists the same.
def _sglang_plans(refs, cw, cv):
    return (
        refs.verify.VerifyPlan.allocate(verify_capacity=cv, device="cpu"),
        refs.write.WritePlan.allocate(write_req_capacity=cw, device="cpu"),
    )


def _plan_inputs(rp, prefix, extend, table, **kw):
    return dict(
        req_pool_indices=torch.tensor(rp, dtype=I64),
        prefix_lens=torch.tensor(prefix, dtype=I64),
        extend_seq_lens=torch.tensor(extend, dtype=I64),
        req_to_token=table,
        **kw,
    )


def _sglang_plan(refs, cw, cv, kw):
    vp, wp = _sglang_plans(refs, cw, cv)
    full = dict(
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    full.update(kw)
    refs.plan_ref(verify_plan_out=vp, write_plan_out=wp, verify_capacity=cv, **full)
    return vp, wp


def _table(rows=3, width=4):
    return (torch.arange(rows * width, dtype=I32).reshape(rows, width) + 1).contiguous()


def test_differs_write_count_clamped_at_2_pow_32(refs):
    """[D1] A row's write count is clamped at 2**32 here (so that no prefix sum wraps for
    any int64 input); SGLang's offsets take ``extend_seq_lens`` as it is."""
    kw = _plan_inputs([1, 2], [1, 1], [2**32 + 5, 1], _table())
    _, wp = _sglang_plan(refs, 2, 4, kw)
    assert wp.write_offsets.tolist() == [0, 2**32 + 5, 2**32 + 6]
    for plan in (plan_reference, launch_plan):
        buffers = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device="cpu")
        plan(buffers, **kw)
        assert buffers.write_offsets.tolist() == [0, 2**32, 2**32 + 1], plan.__name__


def test_differs_request_row_outside_the_table(refs):
    """[D2] An active row whose ``req_pool_indices`` is -1: SGLang's reference indexes
    ``req_to_token[-1]`` (Python's wrap: the table's last row); here the reference refuses
    it and the kernels plan nothing from it (slots 0) and raise a status bit."""
    table = _table()
    kw = _plan_inputs([-1], [2], [1], table)
    vp, wp = _sglang_plan(refs, 1, 4, kw)
    assert vp.verify_slot_indices[:2].tolist() == table[-1, :2].tolist()
    assert int(wp.write_seed_slot_indices[0]) == int(table[-1, 1])
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=4, device="cpu")
    with pytest.raises(ValueError, match=r"req_pool_indices\[0\] = -1"):
        plan_reference(buffers, **kw)
    launch_plan(buffers, **kw)
    assert buffers.take_status() & PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE
    assert buffers.verify_slot_indices[:2].tolist() == [0, 0]
    assert int(buffers.write_seed_slot_indices[0]) == 0


def test_differs_prefix_past_the_table(refs):
    """[D2] ``prefix_lens`` past ``req_to_token.shape[1]``: SGLang's reference raises
    ``IndexError`` (torch's) after clamping the seed's position; here the reference raises
    ``kv-canary: ...`` and the kernels read slot 0 there and raise a status bit."""
    kw = _plan_inputs([1], [6], [1], _table(width=4))
    with pytest.raises(IndexError):
        _sglang_plan(refs, 1, 8, kw)
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=8, device="cpu")
    with pytest.raises(ValueError, match=r"prefix_lens\[0\] = 6"):
        plan_reference(buffers, **kw)
    launch_plan(buffers, **kw)
    assert buffers.take_status() & PlanStatus.PREFIX_LEN_OUT_OF_RANGE
    assert buffers.verify_slot_indices[4:6].tolist() == [0, 0]


def test_differs_negative_length_on_a_busy_row(refs):
    """[D6] A busy row with a negative length: SGLang plans a negative prefix as a fresh
    prefill (its tokens written from the chain head) and a negative extend as a row that
    writes nothing but is verified; here both rows are planned as padding (nothing
    written, nothing verified): the kernels set ``NEGATIVE_LENGTH``, the reference raises."""
    kw = _plan_inputs([1, 2], [-2, 3], [2, -1], _table())
    vp, wp = _sglang_plan(refs, 2, 8, kw)
    assert wp.write_offsets.tolist() == [0, 2, 2]  # row 0's two tokens, from no seed
    assert int(wp.write_seed_slot_indices[0]) == -1
    assert int(vp.verify_num_valid) == 3  # row 1's prefix
    assert vp.verify_slot_indices[:3].tolist() == _table()[2, :3].tolist()
    buffers = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device="cpu")
    with pytest.raises(ValueError, match=r"prefix_lens\[0\] = -2 must be >= 0"):
        plan_reference(buffers, **kw)
    launch_plan(buffers, **kw)
    assert buffers.take_status() == PlanStatus.NEGATIVE_LENGTH
    assert buffers.write_offsets.tolist() == [0, 0, 0]
    assert buffers.write_seed_slot_indices.tolist() == [-1, -1]
    assert (int(buffers.verify_enable), int(buffers.verify_num_valid)) == (1, 0)


def test_differs_valid_length_past_the_pool(refs):
    """[D2] A valid length past the token pool's width: SGLang's reference raises
    ``IndexError``; here the reference refuses it, the kernels stop at the width."""
    pool = torch.arange(12, dtype=I32).reshape(3, 4)
    kw = _plan_inputs(
        [1],
        [4],
        [0],
        _table(),
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=torch.tensor([9], dtype=I64),
        kv_token_id_vs_position_offset=1,
    )
    with pytest.raises(IndexError):
        _sglang_plan(refs, 1, 8, kw)
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=8, device="cpu")
    with pytest.raises(ValueError, match="valid_lens"):
        plan_reference(buffers, **kw)
    launch_plan(buffers, **kw)
    assert buffers.take_status() & PlanStatus.VALID_LEN_OUT_OF_RANGE
    assert buffers.verify_expected_tokens[:4].tolist() == [5, 6, 7, -1]


def test_differs_lut_lookup_past_the_lut(refs):
    """[D2] A slot looked up past ``full_to_swa_index_mapping``: both references raise
    (``ValueError``); the kernels here translate it to slot 0 and raise a status bit, where
    SGLang's kernels clamp the index to the LUT's last entry (its Triton helper
    ``_swa_translate_tile``: a plausible but wrong slot), shown on the seed its Triton
    offsets kernel writes."""
    lut = 100 + torch.arange(6, dtype=I64)  # row 2 of the table holds slots 9..12
    bad = _plan_inputs([2], [3], [1], _table(), swa_window_size=2, full_to_swa_index_mapping=lut)
    with pytest.raises(ValueError, match="outside full_to_swa_index_mapping"):
        _sglang_plan(refs, 1, 8, bad)
    seed = torch.full((1,), -7, dtype=I64)
    refs.plan_offsets(
        req_pool_indices=bad["req_pool_indices"],
        prefix_lens=bad["prefix_lens"],
        extend_seq_lens=bad["extend_seq_lens"],
        req_to_token=bad["req_to_token"],
        full_to_swa_index_mapping=lut,
        out_verify_offsets_scratch=torch.zeros(4097, dtype=I64),
        out_write_offsets=torch.zeros(2, dtype=I64),
        out_write_seed_slot_indices=seed,
        out_verify_num_valid=torch.zeros(1, dtype=I32),
        out_verify_enable=torch.zeros(1, dtype=I32),
        out_write_num_valid_reqs=torch.zeros(1, dtype=I32),
        swa_window_size=2,
        verify_capacity=8,
    )
    assert int(seed) == 105  # slot 11 looked up as lut[5]
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=8, device="cpu")
    with pytest.raises(ValueError, match="full_to_swa_index_mapping"):
        plan_reference(buffers, **bad)
    launch_plan(buffers, **bad)
    assert buffers.take_status() & PlanStatus.LUT_SLOT_OUT_OF_RANGE
    assert buffers.verify_slot_indices[:2].tolist() == [0, 0]
    assert int(buffers.write_seed_slot_indices[0]) == 0


def _sglang_log(ring=8):
    return dict(
        violation_ring=torch.zeros(ring, 8, dtype=I64),
        violation_write_index=torch.zeros(1, dtype=I32),
        slot_run_counter=torch.zeros(1, dtype=I64),
        kernel_run_counter=torch.zeros(1, dtype=I64),
        enable_chain_position_assert=torch.ones(1, dtype=I32),
    )


def _sglang_context(refs, buf, log, sources=(), mode=0):
    return refs.verify.VerifyOrWriteContext(
        canary_buf=buf,
        kernel_kind=refs.verify.CanaryLaunchTag(0),
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=refs.consts.RealKvHashMode(mode),
        **log,
    )


def _one_entry_plans(refs, slot, prev, position=0):
    vp = refs.verify.VerifyPlan.allocate(verify_capacity=1, device="cpu")
    vp.verify_slot_indices.fill_(slot)
    vp.verify_prev_slot_indices.fill_(prev)
    vp.verify_expected_positions.fill_(position)
    vp.verify_expected_tokens.fill_(-1)
    vp.verify_num_valid.fill_(1)
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=1, device="cpu")
    buffers.verify_slot_indices.fill_(slot)
    buffers.verify_prev_slot_indices.fill_(prev)
    buffers.verify_expected_positions.fill_(position)
    buffers.verify_expected_tokens.fill_(-1)
    buffers.verify_num_valid.fill_(1)
    buffers.verify_enable.fill_(1)
    return vp, buffers


def test_differs_negative_verify_slot(refs):
    """[D2] A verify entry of slot -1: SGLang's reference reads the store's last record
    (Python's wrap) and reports on it; here the reference refuses the entry and the kernel
    skips it (counted, not checked) and raises ``VERIFY_SLOT_OUT_OF_RANGE``."""
    n = 8
    buf = torch.zeros(n, 32, dtype=U8)
    buf.view(I64)[n - 1] = torch.tensor([9, 3, 0, 0])  # position 3, chain 0
    vp, buffers = _one_entry_plans(refs, slot=-1, prev=-1, position=0)
    log = _sglang_log()
    refs.verify_ref(
        context=_sglang_context(refs, buf, log), plan=vp, check_verify_expected_token=True
    )
    assert int(log["violation_write_index"]) == 1
    assert log["violation_ring"][0, 1] == -1  # slot -1, the record of slot n - 1
    assert log["violation_ring"][0, 2] == 3
    store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
    store.records.view(U8).copy_(buf)
    with pytest.raises(ValueError, match=r"verify_slot_indices\[0\] = -1"):
        verify_reference(store, buffers)
    assert int(store.kernel_runs) == 0  # nothing written on a refusal
    launch_verify(store, buffers)
    assert store.take_status() & CanaryStatus.VERIFY_SLOT_OUT_OF_RANGE
    report = store.take_violations()
    assert (len(report.violations), report.kernel_runs, report.slots_processed) == (0, 1, 1)


def _write_plans(refs, offsets, seeds, cap=2):
    wp = refs.write.WritePlan.allocate(write_req_capacity=cap, device="cpu")
    wp.write_offsets.zero_()
    wp.write_offsets[: len(offsets)] = torch.tensor(offsets, dtype=I64)
    wp.write_seed_slot_indices[: len(seeds)] = torch.tensor(seeds, dtype=I64)
    wp.write_num_valid_reqs.fill_(len(seeds))
    buffers = PlanBuffers.allocate(write_req_capacity=cap, verify_capacity=1, device="cpu")
    buffers.write_offsets.zero_()
    buffers.write_offsets[: len(offsets)] = torch.tensor(offsets, dtype=I64)
    buffers.write_seed_slot_indices[: len(seeds)] = torch.tensor(seeds, dtype=I64)
    buffers.write_num_valid_reqs.fill_(len(seeds))
    return wp, buffers


def _tokens(ids, pos, loc):
    return dict(
        input_ids=torch.tensor(ids, dtype=I64),
        positions=torch.tensor(pos, dtype=I64),
        out_cache_loc=torch.tensor(loc, dtype=I64),
    )


def _sglang_write(refs, buf, log, wp, tok, sources=(), mode=0):
    refs.write_ref(
        context=_sglang_context(refs, buf, log, sources, mode),
        plan=wp,
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
        **tok,
    )


def test_differs_written_slot_outside_the_store(refs):
    """[D2] ``out_cache_loc`` past the store: SGLang's reference raises ``IndexError`` after
    counting the launch (its records untouched: it writes a copy); here the reference
    refuses before counting anything, and the kernel skips that token (its row's chain does
    not advance over it), writes the others and raises ``WRITE_SLOT_OUT_OF_RANGE``."""
    n = 8
    wp, buffers = _write_plans(refs, [0, 2], [-1], cap=1)
    tok = _tokens([11, 12], [0, 1], [n + 3, 2])
    buf = torch.zeros(n, 32, dtype=U8)
    log = _sglang_log()
    with pytest.raises(IndexError):
        _sglang_write(refs, buf, log, wp, tok)
    assert int(log["kernel_run_counter"]) == 1 and not buf.any()
    store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
    with pytest.raises(ValueError, match=r"out_cache_loc\[0\]"):
        write_reference(store, buffers, **tok)
    assert int(store.kernel_runs) == 0 and not store.records.any()
    launch_write(store, buffers, **tok)
    assert store.take_status() & CanaryStatus.WRITE_SLOT_OUT_OF_RANGE
    assert store.records[2, :2].tolist() == [12, 1]


def test_differs_real_kv_row_outside_a_source(refs):
    """[D2] Sources that do not cover the store (a written slot's real-KV page row past a
    source): SGLang's reference raises (torch's ``index_select``) once a slot past the
    source is written, and its write of slots inside the source is accepted; here both
    paths refuse such sources at every call, naming the geometry, before anything is
    written (the kernels' row check stays behind that rule: tests/records)."""
    n = 8
    kv = torch.zeros(4, 16, dtype=U8)  # rows for slots 0..3 only
    src = refs.verify.RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=16, read_bytes=16)
    wp, buffers = _write_plans(refs, [0, 1], [-1], cap=1)
    tok = _tokens([11], [0], [6])
    with pytest.raises(IndexError):
        _sglang_write(refs, torch.zeros(n, 32, dtype=U8), _sglang_log(), wp, tok, [src], 1)
    inside = _tokens([11], [0], [2])
    buf = torch.zeros(n, 32, dtype=U8)
    _sglang_write(refs, buf, _sglang_log(), wp, inside, [src], 1)
    assert buf.view(I64)[2, 0] == 11  # SGLang: accepted while the slots lie inside
    real_kv = RealKV(mode=RealKVMode.PARTIAL, sources=kv, page_size=1, bytes_per_token=16)
    for write in (write_reference, launch_write):
        for t in (tok, inside):
            store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
            with pytest.raises(
                ValueError,
                match=r"real_kv.sources\[0\] must cover the store's num_slots = 8 slots .* "
                r"got 4 rows x page_size 1 = 4 slots",
            ):
                write(store, buffers, real_kv=real_kv, **t)
            assert not store.records.any() and int(store.kernel_runs) == 0


def test_differs_seed_written_by_another_row_of_the_call(refs):
    """[D3] Row 1 seeds from the slot row 0 writes in the same call (an engine bug: two
    requests given one slot). SGLang's reference runs rows in order, so row 1 continues
    row 0's new record; this project's contract leaves it unspecified (its reference reads
    every seed first, as its kernels do, so row 1 continues the old record)."""
    n = 8
    wp, buffers = _write_plans(refs, [0, 1, 2], [-1, 3], cap=2)
    tok = _tokens([11, 12], [0, 5], [3, 4])
    init = torch.zeros(n, 4, dtype=I64)
    init[3] = torch.tensor([7, 4, 0, 0])
    buf = init.clone().view(U8)
    log = _sglang_log()
    log["enable_chain_position_assert"].zero_()
    _sglang_write(refs, buf, log, wp, tok)
    store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
    store.records.copy_(init)
    write_reference(store, buffers, **tok)
    from kv_canary_buffers.hashing import mix3_int

    assert store.records[3].tolist() == buf.view(I64)[3].tolist()  # row 0's record: equal
    old, new = init[3].tolist(), buf.view(I64)[3].tolist()
    assert int(buf.view(I64)[4, 2]) == mix3_int(new[2], new[0], new[1])  # SGLang: the new
    assert int(store.records[4, 2]) == mix3_int(old[2], old[0], old[1])  # here: the old


def test_differs_chain_position_past_int64_max(refs):
    """[D4] The chain-position check after a record of position ``2**63 - 1``: here the
    expected next position wraps to ``-2**63`` (int64, as on the device), and the write
    appends nothing; SGLang's Python reference computes ``2**63``, a mismatch whose row it
    then cannot store (``ValueError`` from torch, after the records were written)."""
    n = 8
    wp, buffers = _write_plans(refs, [0, 1], [3], cap=1)
    tok = _tokens([11], [-(2**63)], [4])
    init = torch.zeros(n, 4, dtype=I64)
    init[3] = torch.tensor([7, 2**63 - 1, 0, 0])
    buf = init.clone().view(U8)
    log = _sglang_log()
    with pytest.raises(ValueError, match="Overflow"):
        _sglang_write(refs, buf, log, wp, tok)
    assert int(log["violation_write_index"]) == 0
    for write in (write_reference, launch_write):
        store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
        store.records.copy_(init)
        store.enable_chain_position_check()
        write(store, buffers, **tok)
        assert int(store.violation_count) == 0, write.__name__
        assert store.records.view(U8).equal(buf), write.__name__  # the records agree


def test_differs_host_side_checks(refs):
    """[D5] ``bs > write_req_capacity`` and valid lengths without a token pool: refused
    here before anything is written; SGLang's reference plans the rows that fit (the seeds
    of the others and the last offsets are dropped) and ignores the valid lengths."""
    kw = _plan_inputs([1, 2, 0], [1, 2, 0], [1, 1, 0], _table())
    _, wp = _sglang_plan(refs, 2, 8, kw)
    assert wp.write_offsets.tolist() == [0, 1, 2] and int(wp.write_num_valid_reqs) == 3
    buffers = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device="cpu")
    with pytest.raises(ValueError, match="write_req_capacity"):
        plan_reference(buffers, **kw)
    kw = _plan_inputs(
        [1], [2], [1], _table(), req_to_verify_expected_tokens_valid_lens=torch.tensor([2])
    )
    _sglang_plan(refs, 1, 8, kw)
    with pytest.raises(ValueError, match="must be None when req_to_verify_expected_tokens"):
        plan_reference(buffers, **kw)


def test_differs_verify_enable_at_allocation(refs):
    """SGLang allocates ``VerifyPlan.enable`` as 1 (a verify of a plan never filled checks
    whatever the entries hold); ``PlanBuffers.verify_enable`` is 0 until a plan writes it."""
    vp = refs.verify.VerifyPlan.allocate(verify_capacity=4, device="cpu")
    assert int(vp.enable) == 1
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=4, device="cpu")
    assert int(buffers.verify_enable) == 0


# --- per-source geometry (issue 26, section 3) ---------------------------------------------
GEOMETRIES = {
    # name: mode, then per source (page_size, bytes_per_token, read_bytes)
    "page-sizes-ALL": (2, [(1, 32, 32), (4, 32, 32)]),
    "page-sizes-PARTIAL": (1, [(1, 16, 16), (16, 16, 16)]),
    "bytes-per-token-ALL": (2, [(1, 16, 16), (1, 64, 64), (1, 128, 128)]),
    "read-bytes-ALL": (2, [(1, 64, 16), (1, 64, 48), (1, 64, 64), (1, 64, 32)]),
}


def _geometry_sources(spec, num_slots, gen):
    out = []
    for page, bpt, _rb in spec:
        pages = -(-num_slots // page)
        out.append(torch.randint(0, 256, (pages, page * bpt), dtype=U8, generator=gen))
    return out


def _per_source_real_kv(mode, tensors, spec):
    return RealKV(
        mode=RealKVMode(mode),
        sources=[
            RealKVSource(t, page_size=p, bytes_per_token=b, read_bytes=r)
            for t, (p, b, r) in zip(tensors, spec)
        ],
    )


def _geometry_case(refs, mode, spec, stage, real_kv_of, seed=0):
    """Sources of ``spec`` geometries in one launch. ``write``: the records both sides write
    are equal; ``verify``: after one KV byte of slot 4 changed, this project's verify of
    SGLang's records appends SGLang's rows (one ``REAL_KV`` row)."""
    n = 33
    gen = torch.Generator().manual_seed(seed)
    tensors = _geometry_sources(spec, n, gen)
    sources = [
        refs.verify.RealKvSource(tensor=t, page_size=p, num_bytes_per_token=b, read_bytes=r)
        for t, (p, b, r) in zip(tensors, spec)
    ]
    slots = list(range(1, 9))
    wp, buffers = _write_plans(refs, [0, len(slots)], [-1], cap=1)
    tok = _tokens([100 + s for s in slots], list(range(len(slots))), slots)
    buf = torch.zeros(n, 32, dtype=U8)
    _sglang_write(refs, buf, _sglang_log(), wp, tok, sources, mode)
    assert buf.view(I64)[slots, 3].ne(0).all()  # the real-KV hashes are there
    real_kv = real_kv_of(mode, tensors, spec)
    if stage == "write":
        for write in (write_reference, launch_write):
            store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
            write(store, buffers, real_kv=real_kv, **tok)
            assert store.records.view(U8).equal(buf), write.__name__
        return
    s = slots[3]
    page, bpt, _ = spec[-1]
    tensors[-1][s // page, (s % page) * bpt] ^= 0xFF  # slot 4's first KV byte, last source
    vp, plan = _one_entry_plans(refs, slot=s, prev=slots[2], position=3)
    log = _sglang_log()
    refs.verify_ref(
        context=_sglang_context(refs, buf, log, sources, mode),
        plan=vp,
        check_verify_expected_token=True,
    )
    expected = [
        tuple(r) for r in log["violation_ring"][: int(log["violation_write_index"])].tolist()
    ]
    assert [row[7] for row in expected] == [4]  # REAL_KV only
    for verify in (verify_reference, launch_verify):
        store = CanaryStore.allocate(num_slots=n, violation_capacity=8, device="cpu")
        store.records.view(U8).copy_(buf)
        verify(store, plan, real_kv=real_kv)
        got = [tuple(r) for r in store.violations[: int(store.violation_count), :8].tolist()]
        assert got == expected, verify.__name__


@pytest.mark.parametrize("stage", ["write", "verify"])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_per_source_geometry_matches_sglang(refs, name, stage):
    """Sources of different page sizes, token widths or read widths in one launch, as
    SGLang's ``RealKvSource`` allows (SGLang's kernel tests build such sources one by one
    with their own geometry): each a ``RealKVSource``."""
    mode, spec = GEOMETRIES[name]
    _geometry_case(refs, mode, spec, stage, _per_source_real_kv, seed=len(name))


def _one_geometry_real_kv(mode, tensors, spec):
    (page, bpt, rb), *_ = spec
    return RealKV(
        mode=RealKVMode(mode),
        sources=tuple(tensors),
        page_size=page,
        bytes_per_token=bpt,
        read_bytes=rb,
    )


@pytest.mark.parametrize("stage", ["write", "verify"])
@pytest.mark.parametrize(
    "mode, spec",
    [(2, [(4, 32, 32), (4, 32, 32)]), (1, [(16, 16, 16)] * 3), (2, [(1, 64, 48)] * 4)],
    ids=["ALL-2x4x32", "PARTIAL-3x16x16", "ALL-4x1x64r48"],
)
def test_per_source_geometry_harness_holds_with_one_geometry(refs, mode, spec, stage):
    """The per-source cases' harness is sound: with every source of one geometry, given
    as plain tensors with the ``RealKV``'s own geometry, the same cases pass."""
    _geometry_case(refs, mode, spec, stage, _one_geometry_real_kv, seed=5)
