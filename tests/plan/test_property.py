"""Property tests: the reference against the loop oracle, and the kernels against the
reference (valid data) and against the oracle's padding semantics (data outside the
tables), on Hypothesis-generated batches."""

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import OFFSETS_BLOCK, ROW_HINT_STRIDE, SCAN_BLOCK
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import DEFAULT_LAUNCH_CONFIG
from tests.helpers import DEVICE
from tests.helpers.oracle import loop_plan
from tests.helpers.plan import (
    assert_buffers_equal,
    assert_matches_oracle,
    assert_untouched,
    observed,
    poison,
    snapshot,
)

I64, I32 = torch.int64, torch.int32


@st.composite
def batches(draw, *, bad: bool = False, max_bs: int = 24) -> dict[str, Any]:
    """A batch and its capacities. With ``bad``, the data may leave the tables and busy
    rows may have negative lengths (``NEGATIVE_LENGTH``)."""
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    bs = draw(st.integers(0, max_bs))
    rows = draw(st.integers(2, 6))
    cols = draw(st.integers(1, 20))
    n_slots = draw(st.integers(1, 40))
    window = draw(st.sampled_from([0, 0, 1, 2, 5]))
    use_lut = window > 0 or draw(st.booleans())
    use_pool = draw(st.booleans())
    pool_cols = draw(st.integers(0, 24))
    slack = 3 if bad else 0

    rp = torch.randint(1 - slack, rows + slack, (bs,), generator=g)
    rp[torch.rand(bs, generator=g) < 0.25] = 0
    low = -2 if bad else 0  # negative lengths: on padding rows only, unless bad
    prefix = torch.randint(low, cols + 1 + slack, (bs,), generator=g)
    extend = torch.randint(low, 6, (bs,), generator=g)
    pad = rp == 0
    prefix[pad] = torch.randint(-(10**6), 10**6, (int(pad.sum()),), generator=g)
    extend[pad] = torch.randint(-(10**6), 10**6, (int(pad.sum()),), generator=g)
    kwargs: dict[str, Any] = dict(
        req_pool_indices=rp,
        prefix_lens=prefix,
        extend_seq_lens=extend,
        req_to_token=torch.randint(-2, n_slots, (rows, cols), generator=g).to(I32),
        swa_window_size=window,
        kv_token_id_vs_position_offset=draw(st.integers(-2, 2)),
    )
    if draw(st.integers(0, 4)) == 0:  # a write-only plan (the default is verify=True)
        kwargs["verify"] = False
    if use_lut:
        lut_len = n_slots - (draw(st.integers(0, 3)) if bad else 0)
        kwargs["full_to_swa_index_mapping"] = torch.randint(
            -1, 1000, (max(lut_len, 0),), generator=g
        )
    if use_pool:
        pool_rows = rows - (draw(st.integers(0, 1)) if bad else 0)
        kwargs["req_to_verify_expected_tokens"] = torch.randint(
            0, 1000, (pool_rows, pool_cols), generator=g
        ).to(I32)
        kwargs["req_to_verify_expected_tokens_valid_lens"] = torch.randint(
            -1, pool_cols + 1 + slack, (bs,), generator=g
        )
    total = int(torch.where(rp != 0, prefix.clamp(min=0, max=cols + slack), 0).sum())
    caps = dict(
        write_req_capacity=bs + draw(st.integers(0, 3)) or 1,
        verify_capacity=max(1, total + draw(st.integers(-3, 3))),
    )
    return {"kwargs": kwargs, "caps": caps, "bs": bs}


def on_device(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=300, **SETTINGS)
@given(batches())
def test_reference_equals_loop_oracle(case):
    buffers = PlanBuffers.allocate(device="cpu", **case["caps"])
    poison(buffers)
    plan_reference(buffers, **case["kwargs"])
    assert_matches_oracle(buffers, case["bs"], loop_plan(**case["caps"], **case["kwargs"]))


@settings(max_examples=200, **SETTINGS)
@given(batches(bad=True))
def test_reference_raises_exactly_when_data_leaves_the_tables(case):
    buffers = PlanBuffers.allocate(device="cpu", **case["caps"])
    poison(buffers)
    expected = loop_plan(**case["caps"], **case["kwargs"], pad_bad=True)
    if expected["data_flags"] == PlanStatus.OK:
        plan_reference(buffers, **case["kwargs"])
        assert_matches_oracle(buffers, case["bs"], expected)
        assert buffers.take_status() == expected["flags"]  # VERIFY_OVERFLOW, or OK
    else:
        before = snapshot(buffers)
        with pytest.raises(ValueError, match=r"kv-canary: .*(data outside the tables|negative)"):
            plan_reference(buffers, **case["kwargs"])
        assert_untouched(buffers, before)


@settings(max_examples=60, **SETTINGS)
@given(batches())
def test_kernels_equal_reference(case):
    kwargs = on_device(case["kwargs"])
    ref = PlanBuffers.allocate(device=DEVICE, **case["caps"])
    out = PlanBuffers.allocate(device=DEVICE, **case["caps"])
    poison(ref)
    poison(out)
    plan_reference(ref, **kwargs)
    launch_plan(out, **kwargs)
    assert_buffers_equal(out, ref, case["bs"])  # their status words too
    overflowed = int(ref.verify_enable) == 0 and kwargs.get("verify", True)
    assert out.take_status() == (PlanStatus.VERIFY_OVERFLOW if overflowed else PlanStatus.OK)


@settings(max_examples=40, **SETTINGS)
@given(batches(bad=True))
def test_kernels_pad_and_flag_data_outside_the_tables(case):
    out = PlanBuffers.allocate(device=DEVICE, **case["caps"])
    poison(out)
    launch_plan(out, **on_device(case["kwargs"]))
    expected = loop_plan(**case["caps"], **case["kwargs"], pad_bad=True)
    assert_matches_oracle(out, case["bs"], expected)
    assert out.take_status() == expected["flags"]


@pytest.mark.parametrize(
    "bs, capacity",
    [
        # a full row tile of the one-launch path (the total at index bs lies past it,
        # the zeroed tail after it), and the first batch of the next tile
        *((tile, 2 * tile + 3) for tile in DEFAULT_LAUNCH_CONFIG.small_row_tiles),
        *((tile + 1, tile + 1) for tile in DEFAULT_LAUNCH_CONFIG.small_row_tiles),
        (SCAN_BLOCK - 1, SCAN_BLOCK),  # largest one-launch batch
        (SCAN_BLOCK, SCAN_BLOCK),  # smallest two-level one; index bs opens a scan block
        (SCAN_BLOCK + 1, 3 * SCAN_BLOCK),  # capacity tail spans scan blocks
        (SCAN_BLOCK + OFFSETS_BLOCK, SCAN_BLOCK + OFFSETS_BLOCK),  # bs opens a scan block
        (4097, 4097),  # past SGLang's 4096-row single-program scan
        (5000, 9000),
        (4 * SCAN_BLOCK, 4 * SCAN_BLOCK),
    ],
)
def test_kernels_equal_reference_on_multi_block_batches(bs, capacity, large_path):
    g = torch.Generator().manual_seed(bs)
    rows, cols = 64, 12
    rp = torch.randint(1, rows, (bs,), generator=g)
    rp[torch.rand(bs, generator=g) < 0.9] = 0  # keep the entry count small for the interpreter
    kwargs = dict(
        req_pool_indices=rp,
        prefix_lens=torch.randint(0, cols + 1, (bs,), generator=g),
        extend_seq_lens=torch.randint(0, 4, (bs,), generator=g),
        req_to_token=torch.randint(-1, 500, (rows, cols), generator=g).to(I32),
        swa_window_size=3,
        full_to_swa_index_mapping=torch.randint(0, 10**6, (500,), generator=g),
    )
    kwargs = on_device(kwargs)
    ref = PlanBuffers.allocate(write_req_capacity=capacity, verify_capacity=4096, device=DEVICE)
    out = PlanBuffers.allocate(write_req_capacity=capacity, verify_capacity=4096, device=DEVICE)
    poison(ref)
    poison(out)
    plan_reference(ref, **kwargs)
    launch_plan(out, **kwargs)
    assert_buffers_equal(out, ref, bs)
    assert observed(out, bs)["verify_num_valid"] > 0


@pytest.mark.parametrize("window", [0, 40])
def test_large_path_finds_rows_in_registers_and_in_memory(window, large_path):
    """Entry blocks whose rows fit the row window (searched in registers) and blocks of
    many short rows (searched in memory), on both sides of an exactly full window."""
    config = DEFAULT_LAUNCH_CONFIG
    block = config.lut_entry_block if window else config.entry_block
    ROW_WINDOW = config.row_window
    g = torch.Generator().manual_seed(window)

    # SCAN_BLOCK + 1 rows of 1 or 2 entries (many rows a block; the blocks begin and end
    # inside a row, until the last row aligns the next group), then groups of rows
    # that fill one block each: ROW_WINDOW rows (searched in memory) and ROW_WINDOW - 1
    # rows (a full search in registers); then rows longer than the window W (a few a
    # block; each verifies its last W positions), and without a window rows that hold
    # several row hints (and blocks within one row).
    def one_block_of(n_rows):
        short = block // ROW_WINDOW
        return [short] * (n_rows - 1) + [block - (n_rows - 1) * short]

    prefix = (
        [1]
        + [2] * (SCAN_BLOCK - 1)
        + [1]
        + one_block_of(ROW_WINDOW) * 2
        + one_block_of(ROW_WINDOW - 1) * 2
        + [100] * 300
        + [5 * ROW_HINT_STRIDE + 3] * 3
        + [100] * 10
    )
    counts = [min(p, window) if window else p for p in prefix]
    bs, rows, cols = len(prefix), 8, max(prefix) + 2
    kwargs = on_device(
        dict(
            req_pool_indices=torch.randint(1, rows, (bs,), generator=g),
            prefix_lens=torch.tensor(prefix),
            extend_seq_lens=torch.randint(0, 3, (bs,), generator=g),
            req_to_token=torch.randint(0, 5000, (rows, cols), generator=g).to(I32),
            swa_window_size=window,
            req_to_verify_expected_tokens=torch.randint(0, 1000, (rows, cols), generator=g).to(I32),
            req_to_verify_expected_tokens_valid_lens=torch.randint(0, cols, (bs,), generator=g),
        )
    )
    if window:
        kwargs["full_to_swa_index_mapping"] = torch.randint(0, 10**6, (5000,), device=DEVICE)
    total = sum(counts)
    assert bs >= SCAN_BLOCK  # the large path
    # Rows spanned by each entry block, as the kernel sees them.
    starts = torch.tensor([0] + counts).cumsum(0)[:-1]
    spans = [int(((starts > b) & (starts < b + block)).sum()) + 1 for b in range(0, total, block)]
    assert max(spans) > ROW_WINDOW and min(spans) < ROW_WINDOW / 2
    assert ROW_WINDOW in spans and ROW_WINDOW - 1 in spans

    ref = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=total, device=DEVICE)
    out = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=total, device=DEVICE)
    poison(ref)
    poison(out)
    plan_reference(ref, **kwargs)
    launch_plan(out, **kwargs)
    assert_buffers_equal(out, ref, bs)
    assert observed(out, bs)["verify_num_valid"] == total
