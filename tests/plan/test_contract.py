"""Hand cases from the contract, run on both plan paths (reference and kernels)."""

import pytest
import torch

from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from tests.helpers.plan import ENTRY_FIELDS, POISON, poison


def i64(values, device):
    return torch.tensor(values, dtype=torch.int64, device=device)


def lin_table(rows, cols, device, stride=16):
    """req_to_token[rp, pos] = stride * rp + pos (the worked example's table)."""
    t = stride * torch.arange(rows)[:, None] + torch.arange(cols)[None, :]
    return t.to(torch.int32).to(device)


def entries(buffers):
    n = int(buffers.verify_num_valid)
    return {f: getattr(buffers, f)[:n].tolist() for f in ENTRY_FIELDS}


def run(plan, device, *, write_req_capacity=4, verify_capacity=64, **kwargs):
    buffers = PlanBuffers.allocate(
        write_req_capacity=write_req_capacity, verify_capacity=verify_capacity, device=device
    )
    poison(buffers)
    plan(buffers, **kwargs)
    return buffers


def test_worked_example(plan, device):
    b = run(
        plan,
        device,
        req_pool_indices=i64([1, 0, 2], device),
        prefix_lens=i64([5, 99, 3], device),
        extend_seq_lens=i64([1, 99, 1], device),
        req_to_token=lin_table(4, 16, device),
    )
    e = entries(b)
    assert e["verify_slot_indices"] == [16, 17, 18, 19, 20, 32, 33, 34]
    assert e["verify_expected_positions"] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert e["verify_prev_slot_indices"] == [-1, 16, 17, 18, 19, -1, 32, 33]
    assert e["verify_expected_tokens"] == [-1] * 8
    assert int(b.verify_num_valid) == 8 and int(b.verify_enable) == 1
    assert b.write_offsets.tolist() == [0, 1, 1, 2, 0]
    assert b.write_seed_slot_indices[:3].tolist() == [20, -1, 34]
    assert b.write_seed_slot_indices[3].item() == POISON  # rows >= bs: unspecified, untouched
    assert int(b.write_num_valid_reqs) == 3
    assert b.row_req_pool_indices[:3].tolist() == [1, 0, 2]
    assert b.verify_offsets[:4].tolist() == [0, 5, 5, 8]


def test_padding_rows_with_garbage_lengths_contribute_nothing(plan, device):
    b = run(
        plan,
        device,
        req_pool_indices=i64([0, 2, 0, 0], device),
        prefix_lens=i64([10**9, 2, -5, 3], device),
        extend_seq_lens=i64([10**9, 3, -1, 7], device),
        req_to_token=lin_table(3, 8, device),
    )
    assert b.write_offsets.tolist() == [0, 0, 3, 3, 3]
    assert b.write_seed_slot_indices.tolist() == [-1, 33, -1, -1]
    assert entries(b)["verify_slot_indices"] == [32, 33]
    assert int(b.write_num_valid_reqs) == 4


def test_swa_window_start_takes_its_real_predecessor(plan, device):
    lut = torch.arange(100, 164, dtype=torch.int64, device=device)  # slot s -> 100 + s
    b = run(
        plan,
        device,
        req_pool_indices=i64([1, 2], device),
        prefix_lens=i64([6, 2], device),
        extend_seq_lens=i64([1, 1], device),
        req_to_token=lin_table(3, 16, device),
        swa_window_size=3,
        full_to_swa_index_mapping=lut,
    )
    e = entries(b)
    assert e["verify_expected_positions"] == [3, 4, 5, 0, 1]
    assert e["verify_slot_indices"] == [119, 120, 121, 132, 133]
    # position 3 opens the window but is not a chain head: its predecessor is slot 18.
    assert e["verify_prev_slot_indices"] == [118, 119, 120, -1, 132]
    assert b.write_seed_slot_indices.tolist()[:2] == [121, 133]


def test_lut_translates_slots_prev_and_seed_and_negative_slots_pass_through(plan, device):
    table = torch.tensor([[0] * 4, [5, -1, 7, 2]], dtype=torch.int32, device=device)
    lut = torch.tensor([90, 91, 92, 93, 94, 95, 96, 97], dtype=torch.int64, device=device)
    b = run(
        plan,
        device,
        req_pool_indices=i64([1], device),
        prefix_lens=i64([4], device),
        extend_seq_lens=i64([2], device),
        req_to_token=table,
        full_to_swa_index_mapping=lut,  # translation without a window
    )
    e = entries(b)
    assert e["verify_slot_indices"] == [95, -1, 97, 92]
    assert e["verify_prev_slot_indices"] == [-1, 95, -1, 97]
    assert b.write_seed_slot_indices[0].item() == 92


def test_negative_slots_pass_through_without_lut(plan, device):
    table = torch.tensor([[0, 0], [-3, -1]], dtype=torch.int32, device=device)
    b = run(
        plan,
        device,
        req_pool_indices=i64([1], device),
        prefix_lens=i64([2], device),
        extend_seq_lens=i64([1], device),
        req_to_token=table,
    )
    assert entries(b)["verify_slot_indices"] == [-3, -1]
    assert entries(b)["verify_prev_slot_indices"] == [-1, -3]
    assert b.write_seed_slot_indices[0].item() == -1


def test_pool_gather_with_offset_and_valid_length_under_swa(plan, device):
    pool = (1000 * torch.arange(3)[:, None] + torch.arange(10)[None, :]).to(torch.int32)
    lut = torch.arange(64, dtype=torch.int64, device=device)
    b = run(
        plan,
        device,
        req_pool_indices=i64([2, 1], device),
        prefix_lens=i64([6, 3], device),
        extend_seq_lens=i64([0, 0], device),
        req_to_token=lin_table(3, 16, device),
        swa_window_size=4,
        full_to_swa_index_mapping=lut,
        req_to_verify_expected_tokens=pool.to(device),
        # valid_lens is indexed by batch row, the pool by req_pool_indices
        req_to_verify_expected_tokens_valid_lens=i64([6, 10], device),
        kv_token_id_vs_position_offset=1,
    )
    e = entries(b)
    assert e["verify_expected_positions"] == [2, 3, 4, 5, 0, 1, 2]
    # row 0 (rp 2): pos + 1 in {3, 4, 5, 6}; 6 is not < valid_len 6
    assert e["verify_expected_tokens"] == [2003, 2004, 2005, -1, 1001, 1002, 1003]
    assert b.write_seed_slot_indices[:2].tolist() == [-1, -1]  # nothing written: no seed


def test_negative_offset_position_is_unchecked(plan, device):
    pool = torch.arange(8, dtype=torch.int32).reshape(2, 4).to(device)
    b = run(
        plan,
        device,
        req_pool_indices=i64([1], device),
        prefix_lens=i64([2], device),
        extend_seq_lens=i64([1], device),
        req_to_token=lin_table(2, 4, device),
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=i64([4], device),
        kv_token_id_vs_position_offset=-1,
    )
    assert entries(b)["verify_expected_tokens"] == [-1, 4]


@pytest.mark.parametrize("capacity, enable", [(8, 1), (7, 0)])
def test_overflow_is_strict_and_exact_fit_is_enabled(plan, device, capacity, enable):
    b = run(
        plan,
        device,
        verify_capacity=capacity,
        req_pool_indices=i64([1, 0, 2], device),
        prefix_lens=i64([5, 99, 3], device),
        extend_seq_lens=i64([1, 99, 1], device),
        req_to_token=lin_table(4, 16, device),
    )
    assert int(b.verify_enable) == enable
    assert int(b.verify_num_valid) == (8 if enable else capacity)
    # an overflow is flagged on both paths (not an error: the reference sets it too)
    assert b.take_status() == (PlanStatus.OK if enable else PlanStatus.VERIFY_OVERFLOW)
    if not enable:  # no entry is written on overflow
        for f in ENTRY_FIELDS:
            assert (getattr(b, f) == POISON).all()
    else:
        assert entries(b)["verify_slot_indices"] == [16, 17, 18, 19, 20, 32, 33, 34]
    assert b.write_offsets.tolist() == [0, 1, 1, 2, 0]  # the write plan is unaffected


def test_busy_rows_of_negative_length_are_planned_as_padding(plan, device):
    """NEGATIVE_LENGTH: a busy row with P < 0 or E < 0 writes nothing, verifies nothing,
    has no seed; the kernels flag it, the reference refuses it (naming the row)."""
    kwargs = dict(
        req_pool_indices=i64([1, 2, 3, 1], device),
        prefix_lens=i64([-1, 3, 2, 2], device),  # row 0: a negative prefix
        extend_seq_lens=i64([4, -2, 1, 1], device),  # row 1: a negative extend
        req_to_token=lin_table(4, 8, device),
    )
    if plan is plan_reference:
        buffers = run(lambda b, **kw: None, device)
        with pytest.raises(ValueError, match=r"prefix_lens\[0\] = -1 must be >= 0 for busy"):
            plan(buffers, **kwargs)
        assert (buffers.write_offsets == POISON).all()
        return
    b = run(plan, device, **kwargs)
    assert b.write_offsets.tolist() == [0, 0, 0, 1, 2]
    assert b.write_seed_slot_indices.tolist() == [-1, -1, 49, 17]
    assert b.row_req_pool_indices.tolist() == [1, 2, 3, 1]  # the values as given
    e = entries(b)
    assert e["verify_slot_indices"] == [48, 49, 16, 17]  # rows 2 and 3 only
    assert b.verify_offsets.tolist() == [0, 0, 0, 2, 4]
    assert b.take_status() == PlanStatus.NEGATIVE_LENGTH


def test_bs_zero(plan, device):
    b = run(
        plan,
        device,
        req_pool_indices=i64([], device),
        prefix_lens=i64([], device),
        extend_seq_lens=i64([], device),
        req_to_token=lin_table(2, 4, device),
    )
    assert b.write_offsets.tolist() == [0] * 5
    assert int(b.write_num_valid_reqs) == 0
    assert int(b.verify_num_valid) == 0 and int(b.verify_enable) == 1
    assert (b.write_seed_slot_indices == POISON).all()


def test_bs_below_capacity_zeroes_the_offsets_tail(plan, device):
    b = run(
        plan,
        device,
        write_req_capacity=8,
        req_pool_indices=i64([1, 2], device),
        prefix_lens=i64([1, 0], device),
        extend_seq_lens=i64([2, 3], device),
        req_to_token=lin_table(3, 4, device),
    )
    assert b.write_offsets.tolist() == [0, 2, 5, 0, 0, 0, 0, 0, 0]
    assert b.write_seed_slot_indices[:2].tolist() == [16, -1]
    assert (b.write_seed_slot_indices[2:] == POISON).all()


def test_long_lived_buffer_reused_across_shrinking_batches(plan, device):
    buffers = PlanBuffers.allocate(write_req_capacity=6, verify_capacity=32, device=device)
    table = lin_table(7, 8, device)
    for bs in (6, 4, 1, 0, 3):
        rp = i64(list(range(1, bs + 1)), device)
        plan(
            buffers,
            req_pool_indices=rp,
            prefix_lens=i64([2] * bs, device),
            extend_seq_lens=i64([1] * bs, device),
            req_to_token=table,
        )
        assert buffers.write_offsets.tolist() == list(range(bs + 1)) + [0] * (6 - bs)
        assert int(buffers.write_num_valid_reqs) == bs
        assert int(buffers.verify_num_valid) == 2 * bs
        assert buffers.write_seed_slot_indices[:bs].tolist() == [
            16 * r + 1 for r in range(1, bs + 1)
        ]


def test_plans_equal_compares_the_specified_part_only(device):
    from kv_canary_buffers import plan_reference, plans_equal

    kwargs = dict(
        req_pool_indices=i64([1, 0, 2], device),
        prefix_lens=i64([5, 99, 3], device),
        extend_seq_lens=i64([1, 99, 1], device),
        req_to_token=lin_table(4, 16, device),
    )
    a = run(plan_reference, device, **kwargs)
    b = run(plan_reference, device, **kwargs)
    assert plans_equal(a, b, 3)
    b.verify_slot_indices[8:].fill_(123)  # past verify_num_valid: unspecified
    b.write_seed_slot_indices[3] = 5  # row >= bs: unspecified
    assert plans_equal(a, b, 3)
    b.verify_prev_slot_indices[7] += 1
    assert not plans_equal(a, b, 3)
    b.verify_prev_slot_indices[7] -= 1
    b.write_offsets[4] = 1  # the tail must be zero
    assert not plans_equal(a, b, 3)
