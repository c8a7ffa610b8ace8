"""Data outside the tables: the reference raises ValueError naming the row and the value
(writing nothing); the kernels read nothing outside a tensor, write padding values and
raise the status bit of that kind, which take_status() reports and clears."""

import pytest
import torch

from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import SCAN_BLOCK
from kv_canary_kernels import launch_plan
from tests.helpers.oracle import loop_plan
from tests.helpers.plan import assert_matches_oracle, assert_untouched, poison, snapshot

I64, I32 = torch.int64, torch.int32


def base(device):
    return dict(
        req_pool_indices=torch.tensor([1, 0, 2], dtype=I64, device=device),
        prefix_lens=torch.tensor([3, 10**6, 2], dtype=I64, device=device),
        extend_seq_lens=torch.tensor([1, 5, 1], dtype=I64, device=device),
        req_to_token=(torch.arange(24, dtype=I32, device=device).reshape(3, 8) + 1),
        full_to_swa_index_mapping=torch.arange(100, 130, dtype=I64, device=device),
        req_to_verify_expected_tokens=torch.arange(15, dtype=I32, device=device).reshape(3, 5),
        req_to_verify_expected_tokens_valid_lens=torch.tensor([5, 99, 5], dtype=I64, device=device),
    )


def set_row(kwargs, name, row, value):
    t = kwargs[name].clone()
    t[row] = value
    kwargs[name] = t


CASES = {
    # name: (mutation, status bit, reference message)
    "rp past the table": (
        lambda k: set_row(k, "req_pool_indices", 2, 3),
        PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE | PlanStatus.POOL_ROW_OUT_OF_RANGE,
        r"req_pool_indices\[2\] = 3 must be in \[0, 3\)",
    ),
    "negative rp": (
        lambda k: set_row(k, "req_pool_indices", 0, -4),
        PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE | PlanStatus.POOL_ROW_OUT_OF_RANGE,
        r"req_pool_indices\[0\] = -4 must be in \[0, 3\)",
    ),
    "prefix past the width": (
        lambda k: set_row(k, "prefix_lens", 2, 11),
        PlanStatus.PREFIX_LEN_OUT_OF_RANGE,
        r"prefix_lens\[2\] = 11 must be <= req_to_token.shape\[1\] = 8",
    ),
    "slot at the lut length": (
        lambda k: k.update(full_to_swa_index_mapping=k["full_to_swa_index_mapping"][:9].clone()),
        PlanStatus.LUT_SLOT_OUT_OF_RANGE,
        r"slot 11 read by row 0 at position 2 must be < len\(full_to_swa_index_mapping\) = 9",
    ),
    "pool row missing": (
        lambda k: k.update(
            req_to_verify_expected_tokens=k["req_to_verify_expected_tokens"][:2].clone()
        ),
        PlanStatus.POOL_ROW_OUT_OF_RANGE,
        r"req_pool_indices\[2\] = 2 must be in \[0, 2\) = \[0, req_to_verify_expected_tokens",
    ),
    "negative prefix": (
        lambda k: set_row(k, "prefix_lens", 0, -3),
        PlanStatus.NEGATIVE_LENGTH,
        r"prefix_lens\[0\] = -3 must be >= 0 for busy row 0 \(a negative length",
    ),
    "negative extend": (
        lambda k: set_row(k, "extend_seq_lens", 2, -1),
        PlanStatus.NEGATIVE_LENGTH,
        r"extend_seq_lens\[2\] = -1 must be >= 0 for busy row 2",
    ),
    # a row of negative length is planned as padding: none of its other values is checked
    "negative row with every other value out of range": (
        lambda k: (
            set_row(k, "req_pool_indices", 2, 7),
            set_row(k, "prefix_lens", 2, 10**6),
            set_row(k, "extend_seq_lens", 2, -(2**63)),
            set_row(k, "req_to_verify_expected_tokens_valid_lens", 2, 10**6),
        ),
        PlanStatus.NEGATIVE_LENGTH,
        r"extend_seq_lens\[2\] = -9223372036854775808 must be >= 0",
    ),
    "valid length past the pool": (
        lambda k: set_row(k, "req_to_verify_expected_tokens_valid_lens", 0, 6),
        PlanStatus.VALID_LEN_OUT_OF_RANGE,
        r"req_to_verify_expected_tokens_valid_lens\[0\] = 6 must be <= .*shape\[1\] = 5",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_raises_naming_row_and_value_and_writes_nothing(device, case):
    mutate, _bit, message = CASES[case]
    kwargs = base(device)
    mutate(kwargs)
    buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=32, device=device)
    poison(buffers)
    before = snapshot(buffers)
    with pytest.raises(ValueError, match=message):
        plan_reference(buffers, **kwargs)
    assert_untouched(buffers, before)


@pytest.mark.parametrize("padding_rows", [0, SCAN_BLOCK], ids=["small path", "large path"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_raise_the_status_bit_and_write_padding_values(
    device, case, padding_rows, large_path
):
    """On both kernel paths: the large path plans the same rows behind SCAN_BLOCK padding
    rows (its seed programs and entry blocks raise the bits there)."""
    mutate, bit, _message = CASES[case]
    kwargs = base(device)
    mutate(kwargs)
    pad = torch.zeros(padding_rows, dtype=I64, device=device)
    for name in (
        "req_pool_indices",
        "prefix_lens",
        "extend_seq_lens",
        "req_to_verify_expected_tokens_valid_lens",
    ):
        kwargs[name] = torch.cat([pad, kwargs[name]])
    bs = padding_rows + 3
    buffers = PlanBuffers.allocate(write_req_capacity=max(bs, 4), verify_capacity=32, device=device)
    poison(buffers)
    launch_plan(buffers, **kwargs)
    expected = loop_plan(write_req_capacity=max(bs, 4), verify_capacity=32, pad_bad=True, **kwargs)
    assert expected["flags"] == bit
    assert_matches_oracle(buffers, bs, expected)
    assert buffers.take_status() == bit
    assert buffers.take_status() == PlanStatus.OK


def test_bad_values_on_padding_rows_are_ignored(plan, device):
    kwargs = base(device)
    set_row(kwargs, "req_pool_indices", 1, 0)  # row 1 is padding with wild values
    set_row(kwargs, "prefix_lens", 1, 10**9)
    set_row(kwargs, "req_to_verify_expected_tokens_valid_lens", 1, 10**9)
    buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=32, device=device)
    plan(buffers, **kwargs)
    assert buffers.take_status() == PlanStatus.OK
    assert int(buffers.verify_num_valid) == 5


def test_status_bits_are_sticky_across_launches(device):
    buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=32, device=device)
    bad = base(device)
    set_row(bad, "prefix_lens", 2, 11)
    launch_plan(buffers, **bad)
    launch_plan(buffers, **base(device))  # a clean launch does not clear the bit
    assert buffers.take_status() == PlanStatus.PREFIX_LEN_OUT_OF_RANGE


def test_lut_is_not_checked_for_entries_skipped_by_overflow(plan, device):
    kwargs = base(device)
    kwargs["full_to_swa_index_mapping"] = torch.arange(100, 124, dtype=I64, device=device)
    kwargs["req_to_token"] = kwargs["req_to_token"].clone()
    kwargs["req_to_token"][1, 0] = 99  # read by row 0's entries only, never as a seed
    buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=4, device=device)
    plan(buffers, **kwargs)  # 5 entries > 4: overflow, so slot 99 is never looked up
    assert int(buffers.verify_enable) == 0
    assert buffers.take_status() == PlanStatus.VERIFY_OVERFLOW  # and no LUT bit
