"""The plan from a block table (docs/contract.md, "The table"): ``block_table`` int32
``[rows, max_blocks]`` with ``page_size`` instead of ``req_to_token``. A paged plan is the
``req_to_token`` plan of the expanded table: on generated batches (valid data, data
outside the tables, hostile int64 rows, every kernel path) both plan paths from the block
table equal the plan from its expansion (``tests.helpers.plan.expand_block_table``) and the
loop oracle, status bits included; then the extremes of ``page_size`` and positions, the
host-side errors, and the operator inside ``torch.compile``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kv_canary_buffers import GraphInputs, PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import INT64_MAX, SCAN_BLOCK
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import launch_config
from tests.helpers import DEVICE, LARGE_PATHS
from tests.helpers.oracle import loop_plan
from tests.helpers.plan import (
    arena_snapshot,
    assert_arena_unchanged,
    assert_buffers_equal,
    assert_in_bounds,
    assert_matches_oracle,
    expand_block_table,
    poison,
    poison_arena,
    random_block_table,
)

I64, I32 = torch.int64, torch.int32
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def on_device(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@st.composite
def paged_batches(draw, *, bad: bool = False, max_bs: int = 20, pad_rows: int = 0):
    """A batch planned from a block table, and the same batch from its expansion. With
    ``bad``, rows may leave the table (request rows, prefixes past the last block, slots
    past the LUT, the token pool) and busy rows may have negative lengths. ``pad_rows``
    padding rows of garbage lengths go first (the large paths)."""
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    page = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16]))
    rows = draw(st.integers(2, 6))
    blocks = draw(st.integers(1, 5))
    n_blocks = draw(st.integers(1, 12))
    width = blocks * page
    block_table = random_block_table(g, rows=rows, blocks=blocks, n_blocks=n_blocks)
    n = draw(st.integers(0, max_bs))
    slack = 3 if bad else 0
    low = -2 if bad else 0
    rp = torch.randint(1 - slack, rows + slack, (n,), generator=g)
    rp[torch.rand(n, generator=g) < 0.25] = 0
    prefix = torch.randint(low, width + 1 + slack, (n,), generator=g)
    extend = torch.randint(low, 5, (n,), generator=g)
    pad = rp == 0
    prefix[pad] = torch.randint(-(10**6), 10**6, (int(pad.sum()),), generator=g)
    if pad_rows:
        z = torch.zeros(pad_rows, dtype=I64)
        rp, extend = torch.cat([z, rp]), torch.cat([z + 7, extend])
        prefix = torch.cat([torch.randint(-(10**9), 10**9, (pad_rows,), generator=g), prefix])
    bs = n + pad_rows
    window = draw(st.sampled_from([0, 0, 1, 3, 2**62]))
    kwargs: dict[str, Any] = dict(
        req_pool_indices=rp,
        prefix_lens=prefix,
        extend_seq_lens=extend,
        swa_window_size=window,
        kv_token_id_vs_position_offset=draw(st.integers(-2, 2)),
    )
    if window > 0 or draw(st.booleans()):
        lut_len = n_blocks * page - (draw(st.integers(0, 3)) if bad else 0)
        kwargs["full_to_swa_index_mapping"] = torch.randint(
            -1, 10**4, (max(lut_len, 0),), generator=g
        )
    if draw(st.booleans()):
        pool_cols = draw(st.integers(0, width + 2))
        kwargs["req_to_verify_expected_tokens"] = torch.randint(
            0, 1000, (rows - (draw(st.integers(0, 1)) if bad else 0), pool_cols), generator=g
        ).to(I32)
        kwargs["req_to_verify_expected_tokens_valid_lens"] = torch.randint(
            -1, pool_cols + 1 + slack, (bs,), generator=g
        )
    if draw(st.integers(0, 4)) == 0:
        kwargs["verify"] = False
    total = int(torch.where(rp != 0, prefix.clamp(0, width + slack), 0).sum())
    caps = dict(
        write_req_capacity=max(bs + draw(st.integers(0, 3)), 1),
        verify_capacity=max(1, total + draw(st.integers(-3, 3))),
    )
    paged = dict(kwargs, block_table=block_table, page_size=page)
    flat = dict(kwargs, req_to_token=expand_block_table(block_table, page))
    return {"paged": paged, "flat": flat, "caps": caps, "bs": bs}


def check_paths_agree(case: dict[str, Any]) -> None:
    """Both paths from the block table against the reference from the expanded table
    (the reference raising exactly when the oracle says the data leaves the tables) and
    the kernels from the expanded table (status bits included), and every path against
    the oracle."""
    paged, flat = on_device(case["paged"]), on_device(case["flat"])
    caps, bs = case["caps"], case["bs"]
    expected = loop_plan(**caps, **case["paged"], pad_bad=True)
    assert loop_plan(**caps, **case["flat"], pad_bad=True) == expected  # the oracle agrees
    kernels_flat = PlanBuffers.allocate(device=DEVICE, **caps)
    kernels_paged = PlanBuffers.allocate(device=DEVICE, **caps)
    poison_arena(kernels_flat)
    poison_arena(kernels_paged)
    launch_plan(kernels_flat, **flat)
    launch_plan(kernels_paged, **paged)
    assert_buffers_equal(kernels_paged, kernels_flat, bs)
    assert_matches_oracle(kernels_paged, bs, expected)
    assert_in_bounds(kernels_paged, bs)
    assert kernels_paged.take_status() == expected["flags"]
    ref = PlanBuffers.allocate(device=DEVICE, **caps)
    poison_arena(ref)
    if expected["data_flags"] != PlanStatus.OK:
        before = arena_snapshot(ref)
        with pytest.raises(ValueError, match=r"kv-canary: .*(data outside the tables|negative)"):
            plan_reference(ref, **paged)
        assert_arena_unchanged(ref, before)
        return
    plan_reference(ref, **paged)
    ref_flat = PlanBuffers.allocate(device=DEVICE, **caps)
    poison_arena(ref_flat)
    plan_reference(ref_flat, **flat)
    assert_buffers_equal(ref, ref_flat, bs)
    assert_buffers_equal(ref, kernels_flat, bs)


@settings(max_examples=150, **SETTINGS)
@given(paged_batches())
def test_a_block_table_plan_is_the_plan_of_its_expansion(case):
    check_paths_agree(case)


@settings(max_examples=80, **SETTINGS)
@given(paged_batches(bad=True))
def test_out_of_range_data_from_a_block_table_as_from_its_expansion(case):
    check_paths_agree(case)


@settings(max_examples=8, **SETTINGS)
@given(paged_batches(bad=True, max_bs=12, pad_rows=SCAN_BLOCK))
@pytest.mark.parametrize("path", sorted(LARGE_PATHS))
def test_a_block_table_plan_on_the_large_paths(path, case):
    with launch_config(**LARGE_PATHS[path]):
        check_paths_agree(case)


# --- the contract's hand cases -----------------------------------------------------------
def i64(values):
    return torch.tensor(values, dtype=I64, device=DEVICE)


def worked_batch(**kw):
    return dict(
        req_pool_indices=i64([1, 0, 2]),
        prefix_lens=i64([5, 99, 3]),
        extend_seq_lens=i64([1, 99, 1]),
        **kw,
    )


def test_worked_example_from_a_block_table(plan):
    """docs/contract.md, "Worked example": ``block_table[rp, j] = 4*rp + j``, page 4, is
    the worked example's table ``16*rp + pos``: the same plan, byte for byte."""
    block_table = (4 * torch.arange(4)[:, None] + torch.arange(4)[None, :]).to(I32).to(DEVICE)
    lin = (16 * torch.arange(4)[:, None] + torch.arange(16)[None, :]).to(I32).to(DEVICE)
    assert torch.equal(expand_block_table(block_table, 4), lin)
    a = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=64, device=DEVICE)
    b = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=64, device=DEVICE)
    poison(a)
    poison(b)
    plan(a, **worked_batch(block_table=block_table, page_size=4))
    plan(b, **worked_batch(req_to_token=lin))
    assert_buffers_equal(a, b, 3)
    assert a.verify_slot_indices[:8].tolist() == [16, 17, 18, 19, 20, 32, 33, 34]
    assert a.write_seed_slot_indices[:3].tolist() == [20, -1, 34]


def test_an_unmapped_page_gives_no_slot(plan):
    """docs/contract.md: ``block_table[2] = [8, -1, 10, 11]``, prefix 7: row 2's positions
    4..6 lie in the unmapped page (slot -1, as a negative req_to_token value), and so
    does its seed."""
    block_table = (4 * torch.arange(4)[:, None] + torch.arange(4)[None, :]).to(I32)
    block_table[2, 1] = -1
    b = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=64, device=DEVICE)
    poison(b)
    kwargs = worked_batch(block_table=block_table.to(DEVICE), page_size=4)
    kwargs["prefix_lens"] = i64([5, 99, 7])
    plan(b, **kwargs)
    n = int(b.verify_num_valid)
    assert b.verify_slot_indices[5:n].tolist() == [32, 33, 34, 35, -1, -1, -1]
    assert b.verify_prev_slot_indices[5:n].tolist() == [-1, 32, 33, 34, 35, -1, -1]
    assert b.verify_expected_positions[5:n].tolist() == list(range(7))
    assert b.write_seed_slot_indices[:3].tolist() == [20, -1, -1]
    assert b.take_status() == PlanStatus.OK


def test_a_prefix_past_the_last_block(plan):
    """``P > max_blocks * page_size``: PREFIX_LEN_OUT_OF_RANGE on the kernels (slots 0 past
    the width), the reference's message names the block table."""
    block_table = torch.tensor([[0, 0], [3, 4]], dtype=I32, device=DEVICE)
    kwargs = dict(
        req_pool_indices=i64([1]),
        prefix_lens=i64([7]),
        extend_seq_lens=i64([1]),
        block_table=block_table,
        page_size=3,
    )
    b = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=8, device=DEVICE)
    poison(b)
    if plan is plan_reference:
        with pytest.raises(
            ValueError,
            match=r"prefix_lens\[0\] = 7 must be <= block_table.shape\[1\] \* page_size = 6",
        ):
            plan(b, **kwargs)
        return
    plan(b, **kwargs)
    assert b.verify_slot_indices[:7].tolist() == [9, 10, 11, 12, 13, 14, 0]
    assert b.write_seed_slot_indices[0].item() == 0
    assert b.take_status() == PlanStatus.PREFIX_LEN_OUT_OF_RANGE


def test_a_request_row_past_the_block_table(plan):
    block_table = torch.tensor([[0, 0], [3, 4]], dtype=I32, device=DEVICE)
    kwargs = dict(
        req_pool_indices=i64([2]),
        prefix_lens=i64([2]),
        extend_seq_lens=i64([1]),
        block_table=block_table,
        page_size=3,
    )
    b = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=8, device=DEVICE)
    if plan is plan_reference:
        with pytest.raises(ValueError, match=r"in \[0, 2\) = \[0, block_table.shape\[0\]\)"):
            plan(b, **kwargs)
        return
    plan(b, **kwargs)
    assert b.verify_slot_indices[:2].tolist() == [0, 0]
    assert b.take_status() == PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE


# --- extremes: page_size up to 2**31 - 1, positions up to 2**63 - 1, ids up to 2**31 - 1 ----
EXTREME_IDS = torch.tensor([[0, 0, 0], [2**31 - 1, -1, 5], [3, 2**31 - 2, 2**31 - 1]], dtype=I32)


@pytest.mark.parametrize("page", [2**31 - 1, 2**30, 2**31 - 2, 7])
@pytest.mark.parametrize("pad_rows", [0, SCAN_BLOCK], ids=["small", "large"])
def test_extreme_pages_and_block_ids_give_exact_slots(plan, page, pad_rows, large_path):
    """Slots ``b * page_size + offset`` up to ``(2**31 - 1) * (2**31 - 1) + 2**31 - 2``
    (below ``2**62``: no wrap), read as seeds (a write-only plan: the prefixes hold up to
    ``3 * page_size`` entries), on both paths, exact."""
    width = 3 * page
    z = [0] * pad_rows
    kwargs = dict(
        req_pool_indices=torch.tensor(z + [2, 1, 1, 2], dtype=I64),
        prefix_lens=torch.tensor(z + [width, 2 * page + 2, page + 1, page], dtype=I64),
        extend_seq_lens=torch.tensor(z + [1, 1, 1, 1], dtype=I64),
        block_table=EXTREME_IDS,
        page_size=page,
        verify=False,
    )
    bs = pad_rows + 4
    b = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=1, device=DEVICE)
    poison_arena(b)
    plan(b, **on_device(kwargs))
    seeds = [
        (2**31 - 1) * page + page - 1,  # row 0: the last position of block 2**31 - 1
        5 * page + 1,  # row 1: block id 5
        -1,  # row 2: position page, in the unmapped page
        3 * page + page - 1,  # row 3: block id 3
    ]
    assert b.write_seed_slot_indices[pad_rows:bs].tolist() == seeds
    assert max(seeds) < 2**62
    assert_matches_oracle(b, bs, loop_plan(write_req_capacity=bs, verify_capacity=1, **kwargs))
    assert_in_bounds(b, bs)
    assert b.take_status() == PlanStatus.OK


@pytest.mark.parametrize("page", [2**31 - 1, 5])
@pytest.mark.parametrize("pad_rows", [0, SCAN_BLOCK], ids=["small", "large"])
def test_positions_near_int64_max_from_a_block_table(page, pad_rows, large_path):
    """The kernels: a window at the end of prefixes up to ``2**63 - 1``, past the table's
    ``3 * page_size`` positions: the entries at their exact positions, slots 0 past the
    width, PREFIX_LEN_OUT_OF_RANGE; no read outside the table (the oracle's arithmetic is
    Python's, exact)."""
    width = 3 * page
    z = [0] * pad_rows
    kwargs = dict(
        req_pool_indices=torch.tensor(z + [2, 1, 2], dtype=I64),
        prefix_lens=torch.tensor(z + [INT64_MAX, width + 1, width], dtype=I64),
        extend_seq_lens=torch.tensor(z + [1, 1, 1], dtype=I64),
        block_table=EXTREME_IDS,
        page_size=page,
        swa_window_size=3,
        full_to_swa_index_mapping=torch.arange(100, 110, dtype=I64),
    )
    bs = pad_rows + 3
    caps = dict(write_req_capacity=bs, verify_capacity=9)
    expected = loop_plan(**caps, **kwargs, pad_bad=True)
    b = PlanBuffers.allocate(device=DEVICE, **caps)
    poison_arena(b)
    launch_plan(b, **on_device(kwargs))
    assert_matches_oracle(b, bs, expected)
    assert_in_bounds(b, bs)
    assert b.verify_expected_positions[:3].tolist() == [INT64_MAX - 3, INT64_MAX - 2, INT64_MAX - 1]
    assert b.verify_slot_indices[:3].tolist() == [0, 0, 0]
    assert b.take_status() == expected["flags"]
    assert expected["flags"] & PlanStatus.PREFIX_LEN_OUT_OF_RANGE


# --- host-side errors: nothing written ---------------------------------------------------
def base_kwargs(**kw):
    kwargs = dict(
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([2, 3]),
        extend_seq_lens=i64([1, 1]),
    )
    kwargs.update(kw)
    return kwargs


BT = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=I32)
TABLE_ERRORS = {
    "neither table": (
        {},
        ValueError,
        r"req_to_token or block_table must be given .* got neither",
    ),
    "both tables": (
        {"req_to_token": torch.zeros(3, 4, dtype=I32), "block_table": BT},
        ValueError,
        r"exactly one of req_to_token and block_table must be given, got both",
    ),
    "int64 block table": (
        {"block_table": BT.long()},
        ValueError,
        r"block_table must have dtype torch.int32, got torch.int64",
    ),
    "1-D block table": (
        {"block_table": BT.flatten()},
        ValueError,
        r"block_table must be 2-D \[rows, max_blocks\], got 1-D",
    ),
    "strided block table": (
        {"block_table": BT.t()},
        ValueError,
        r"block_table must be contiguous",
    ),
    "block table not a tensor": (
        {"block_table": [[0, 1]]},
        TypeError,
        r"block_table must be a torch.Tensor, got list",
    ),
    "page size 0": (
        {"block_table": BT, "page_size": 0},
        ValueError,
        r"page_size must be >= 1, got 0",
    ),
    "page size 2**31": (
        {"block_table": BT, "page_size": 2**31},
        ValueError,
        r"page_size must be in \[1, 2147483647\] .* got 2147483648",
    ),
    "page size float": (
        {"block_table": BT, "page_size": 4.0},
        TypeError,
        r"page_size must be an int, got float",
    ),
    "page size bool": (
        {"block_table": BT, "page_size": True},
        TypeError,
        r"page_size must be an int, got bool",
    ),
    "page size with req_to_token": (
        {"req_to_token": torch.zeros(3, 4, dtype=I32), "page_size": 16},
        ValueError,
        r"page_size must be 1 \(its default\) with req_to_token, got 16",
    ),
    "page size tensor with req_to_token": (
        {"req_to_token": torch.zeros(3, 4, dtype=I32), "page_size": torch.tensor(1)},
        TypeError,
        r"page_size must be an int, got Tensor",
    ),
}


@pytest.mark.parametrize("case", sorted(TABLE_ERRORS))
def test_table_errors_name_the_arguments_and_write_nothing(plan, case):
    extra, exc, match = TABLE_ERRORS[case]
    b = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEVICE)
    poison_arena(b)
    before = arena_snapshot(b)
    with pytest.raises(exc, match="kv-canary: " + match):
        plan(b, **on_device(base_kwargs(**extra)))
    assert_arena_unchanged(b, before)


def test_a_block_table_inside_the_arena_is_refused(plan):
    b = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=64, device=DEVICE)
    inside = b.verify_slot_indices[:8].view(I32).view(4, 4)
    poison_arena(b)
    before = arena_snapshot(b)
    with pytest.raises(ValueError, match="kv-canary: block_table must not share memory"):
        plan(b, **on_device(base_kwargs(block_table=inside, page_size=2)))
    assert_arena_unchanged(b, before)


def test_a_block_table_on_another_device_is_refused(plan):
    b = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEVICE)
    kwargs = on_device(base_kwargs(page_size=2))
    kwargs["block_table"] = torch.zeros(3, 2, dtype=I32, device="meta")
    with pytest.raises(ValueError, match="kv-canary: block_table must be on the buffers' device"):
        plan(b, **kwargs)


def test_numpy_page_sizes_are_accepted(plan):
    np = pytest.importorskip("numpy")
    b = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEVICE)
    plan(b, **on_device(base_kwargs(block_table=BT, page_size=np.int32(2))))
    assert b.verify_slot_indices[:5].tolist() == [4, 5, 8, 9, 10]
    c = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEVICE)
    plan(c, **on_device(base_kwargs(req_to_token=expand_block_table(BT, 2), page_size=np.int64(1))))
    assert_buffers_equal(b, c, 2)


def test_staging_rows_plan_from_a_block_table(plan):
    """GraphInputs is unchanged: its rows plan from a block table as from req_to_token
    (the table is an input like req_to_token)."""
    b = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEVICE)
    staging = GraphInputs.for_buffers(b)
    staging.fill(req_pool_indices=i64([1, 2]), prefix_lens=i64([2, 3]), extend_seq_lens=i64([1, 1]))
    plan(b, block_table=BT.to(DEVICE), page_size=2, **staging.plan_kwargs())
    assert b.verify_slot_indices[:5].tolist() == [4, 5, 8, 9, 10]
    assert b.write_seed_slot_indices[:4].tolist() == [5, 10, -1, -1]
