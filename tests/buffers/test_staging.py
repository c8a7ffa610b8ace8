"""GraphInputs: capacity-sized per-row inputs whose rows past the batch are padding, so
one (captured) plan of bs = capacity serves any smaller batch."""

import pytest
import torch

from kv_canary_buffers import GraphInputs, PlanBuffers
from tests.helpers.plan import ENTRY_FIELDS, make_rows, make_tables, poison

I64 = torch.int64


def test_fill_copies_rows_and_pads_the_rest(device):
    staging = GraphInputs.allocate(capacity=6, device=device)
    for t in (
        staging.req_pool_indices,
        staging.prefix_lens,
        staging.extend_seq_lens,
        staging.valid_lens,
    ):
        t.fill_(99)  # an earlier, larger step
    staging.fill(
        req_pool_indices=torch.tensor([3, 1], dtype=I64, device=device),
        prefix_lens=torch.tensor([5, 7], dtype=I64, device=device),
        extend_seq_lens=torch.tensor([1, 2], dtype=I64, device=device),
        valid_lens=torch.tensor([4, 6], dtype=I64, device=device),
    )
    assert staging.req_pool_indices.tolist() == [3, 1, 0, 0, 0, 0]
    assert staging.prefix_lens.tolist() == [5, 7, 0, 0, 0, 0]
    assert staging.extend_seq_lens.tolist() == [1, 2, 0, 0, 0, 0]
    assert staging.valid_lens.tolist() == [4, 6, 0, 0, 0, 0]


def test_fill_keeps_addresses(device):
    staging = GraphInputs.allocate(capacity=4, device=device)
    before = [t.data_ptr() for t in staging.plan_kwargs(with_valid_lens=True).values()]
    z = torch.zeros(3, dtype=I64, device=device)
    staging.fill(req_pool_indices=z, prefix_lens=z, extend_seq_lens=z)
    after = [t.data_ptr() for t in staging.plan_kwargs(with_valid_lens=True).values()]
    assert before == after


@pytest.mark.parametrize(
    "bad, match",
    [
        (
            dict(req_pool_indices=torch.zeros(5, dtype=I64)),
            r"len\(req_pool_indices\) must be <= GraphInputs.capacity, got 5 > 4",
        ),
        (
            dict(prefix_lens=torch.zeros(3, dtype=torch.int32)),
            "prefix_lens must have dtype torch.int64, got torch.int32",
        ),
        (
            dict(extend_seq_lens=torch.zeros(2, dtype=I64)),
            r"extend_seq_lens must have length bs = len\(req_pool_indices\) = 3, got 2",
        ),
        (dict(valid_lens=torch.zeros(3, 1, dtype=I64)), "valid_lens must be 1-D"),
    ],
)
def test_fill_rejects_bad_rows_before_writing(bad, match):
    staging = GraphInputs.allocate(capacity=4, device="cpu")
    staging.req_pool_indices.fill_(7)
    rows = dict(
        req_pool_indices=torch.ones(3, dtype=I64),
        prefix_lens=torch.ones(3, dtype=I64),
        extend_seq_lens=torch.ones(3, dtype=I64),
    )
    rows.update(bad)
    with pytest.raises(ValueError, match=match):
        staging.fill(**rows)
    assert staging.req_pool_indices.tolist() == [7, 7, 7, 7]


@pytest.mark.parametrize("n", [0, 1, 5, 8])
def test_padded_plan_equals_the_plan_of_the_batch(plan, device, n):
    """The plan of the staged batch (bs = capacity) has the batch's entries and seeds,
    and offsets that stay at the batch's total past its rows."""
    g = torch.Generator().manual_seed(n)
    capacity = 8
    tables = make_tables(
        g, rows=9, max_seq_len=12, n_slots=200, lut=True, pool_cols=12, device=device
    )
    rows = make_rows(g, bs=n, rows=9, max_prefix=11, pool_cols=12, pad_fraction=0.0, device=device)
    common = dict(
        req_to_token=tables["req_to_token"],
        swa_window_size=4,
        full_to_swa_index_mapping=tables["full_to_swa_index_mapping"],
        req_to_verify_expected_tokens=tables["req_to_verify_expected_tokens"],
    )
    direct = PlanBuffers.allocate(write_req_capacity=capacity, verify_capacity=200, device=device)
    staged = PlanBuffers.allocate(write_req_capacity=capacity, verify_capacity=200, device=device)
    poison(direct)
    poison(staged)
    plan(direct, **common, **rows)
    staging = GraphInputs.for_buffers(staged)
    staging.fill(
        req_pool_indices=rows["req_pool_indices"],
        prefix_lens=rows["prefix_lens"],
        extend_seq_lens=rows["extend_seq_lens"],
        valid_lens=rows["req_to_verify_expected_tokens_valid_lens"],
    )
    plan(staged, **common, **staging.plan_kwargs(with_valid_lens=True))
    total = int(direct.write_offsets[n])
    assert staged.write_offsets[: n + 1].tolist() == direct.write_offsets[: n + 1].tolist()
    assert staged.write_offsets[n:].tolist() == [total] * (capacity + 1 - n)
    assert (
        staged.write_seed_slot_indices[:n].tolist() == direct.write_seed_slot_indices[:n].tolist()
    )
    assert (staged.write_seed_slot_indices[n:] == -1).all()  # padding rows: no seed
    assert int(staged.write_num_valid_reqs) == capacity
    nv = int(direct.verify_num_valid)
    assert int(staged.verify_num_valid) == nv and int(staged.verify_enable) == 1
    for f in ENTRY_FIELDS:
        assert getattr(staged, f)[:nv].tolist() == getattr(direct, f)[:nv].tolist()
