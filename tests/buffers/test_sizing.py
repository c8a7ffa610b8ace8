"""``verify_entries_needed``: the host-side count of the verify entries a batch's plan
emits, against the plan itself (both paths) on Hypothesis-generated batches (padding rows
of garbage lengths, windows from 1 to ``2**63 - 1``, prefixes down to ``-2**63``), with the
overflow boundary exact: a capacity of the count verifies, one less overflows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kv_canary_buffers import PlanBuffers, plan_reference, verify_entries_needed
from kv_canary_buffers.layout import INT64_MAX, INT64_MIN, MAX_CAPACITY
from kv_canary_kernels import launch_plan
from tests.helpers import DEVICE

I32 = torch.int32
INT64 = st.integers(INT64_MIN, INT64_MAX)
WINDOWS = st.sampled_from([0, 0, 1, 2, 5, 19, INT64_MAX])


def as_host(values: list[int], form: str) -> Any:
    """The same host data in each form the helper takes."""
    if form == "list":
        return values
    if form == "tuple":
        return tuple(np.int64(v) for v in values)
    if form == "numpy":
        return np.array(values, dtype=np.int64)
    if form == "int32 tensor" and all(-(2**31) <= v < 2**31 for v in values):
        return torch.tensor(values, dtype=I32)
    return torch.tensor(values, dtype=torch.int64)


FORMS = st.sampled_from(["list", "tuple", "numpy", "tensor", "int32 tensor"])


@st.composite
def batches(draw, *, extreme_active: bool = False) -> dict[str, Any]:
    """Rows of a plan: active rows (``rp`` in the table) with prefixes in
    ``[-2**63, cols]`` (``extreme_active``: any int64, past the table too), padding rows
    (``rp == 0``) with any int64 lengths."""
    bs = draw(st.integers(0, 24))
    rows, cols = draw(st.integers(2, 5)), draw(st.integers(1, 20))
    rp, prefix = [], []
    for _ in range(bs):
        if draw(st.integers(0, 3)) == 0:
            rp.append(0)
            prefix.append(draw(INT64))
        else:
            rp.append(draw(st.integers(1, rows - 1)))
            low = st.integers(INT64_MIN, -1) | st.integers(0, cols)
            prefix.append(draw(INT64 if extreme_active else low))
    window = draw(WINDOWS)
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    n_slots = rows * cols
    extend = torch.randint(-2, 4, (bs,), generator=g)
    kwargs = dict(
        req_pool_indices=torch.tensor(rp, dtype=torch.int64),
        prefix_lens=torch.tensor(prefix, dtype=torch.int64),
        extend_seq_lens=extend,
        req_to_token=torch.randperm(n_slots, generator=g).to(I32).view(rows, cols),
        swa_window_size=window,
    )
    if window > 0:
        kwargs["full_to_swa_index_mapping"] = torch.randperm(n_slots, generator=g)
    return {
        "rp": rp,
        "prefix": prefix,
        "extend": extend.tolist(),
        "window": window,
        "kwargs": kwargs,
    }


def negative_busy_row(batch: dict[str, Any]) -> bool:
    """Whether a busy row has a negative length (NEGATIVE_LENGTH: the reference refuses
    the batch, the kernels plan the row as padding)."""
    return any(
        r and (p < 0 or e < 0) for r, p, e in zip(batch["rp"], batch["prefix"], batch["extend"])
    )


def planned(plan, batch: dict[str, Any], verify_capacity: int) -> tuple[int, int]:
    """``(verify_enable, verify_num_valid)`` of the batch planned with this capacity."""
    kwargs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    bs = kwargs["req_pool_indices"].shape[0]
    buffers = PlanBuffers.allocate(
        write_req_capacity=max(bs, 1), verify_capacity=verify_capacity, device=DEVICE
    )
    plan(buffers, **kwargs)
    return int(buffers.verify_enable), int(buffers.verify_num_valid)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=batches(), form=FORMS, rows_form=FORMS)
def test_the_count_is_the_plans_total(plan, batch, form, rows_form):
    need = verify_entries_needed(
        as_host(batch["prefix"], form),
        req_pool_indices=as_host(batch["rp"], rows_form),
        extend_seq_lens=as_host(batch["extend"], rows_form),
        swa_window_size=batch["window"],
    )
    assert type(need) is int
    if plan is plan_reference and negative_busy_row(batch):
        with pytest.raises(ValueError, match="a negative length"):
            planned(plan, batch["kwargs"], max(need, 1))
        return
    assert planned(plan, batch["kwargs"], max(need, 1)) == (1, need)
    if need >= 2:
        assert planned(plan, batch["kwargs"], need - 1) == (0, need - 1)  # overflow


@settings(max_examples=40, deadline=None)
@given(batch=batches(extreme_active=True), form=FORMS)
def test_the_count_with_any_int64_prefix_matches_the_kernels(batch, form):
    """Active prefixes past the table (the kernels raise a status bit, the count is the
    same): exact, however large the sum."""
    need = verify_entries_needed(
        as_host(batch["prefix"], form),
        req_pool_indices=batch["rp"],
        extend_seq_lens=batch["extend"],
        swa_window_size=batch["window"],
    )
    w = batch["window"]
    exact = sum(
        (min(p, w) if w else p)
        for p, r, e in zip(batch["prefix"], batch["rp"], batch["extend"])
        if r and p > 0 and e >= 0
    )
    assert need == exact
    if need <= 1 << 12:
        assert planned(launch_plan, batch["kwargs"], max(need, 1)) == (1, need)
    else:  # too many entries to allocate here: the plan overflows a smaller capacity
        assert planned(launch_plan, batch["kwargs"], 1 << 12) == (0, 1 << 12)


def test_the_worked_example():
    """docs/contract.md, "Worked example": 8 entries (row 1 is padding)."""
    assert verify_entries_needed([5, 99, 3], req_pool_indices=[1, 0, 2]) == 8
    assert verify_entries_needed([5, 99, 3], req_pool_indices=[1, 0, 2], swa_window_size=2) == 4
    assert verify_entries_needed([5, 99, 3]) == 107  # every row active without rp
    # a row of negative extend length is planned as padding (NEGATIVE_LENGTH)
    assert verify_entries_needed([5, 99, 3], extend_seq_lens=[1, -1, 0]) == 8
    assert (
        verify_entries_needed(
            torch.tensor([5, 99, 3]), req_pool_indices=[1, 2, 2], extend_seq_lens=[-3, 0, 0]
        )
        == 102
    )
    with pytest.raises(
        ValueError, match=r"extend_seq_lens must have length len\(prefix_lens\) = 3"
    ):
        verify_entries_needed([5, 99, 3], extend_seq_lens=[1])


@pytest.mark.parametrize(
    "prefix, window, expected",
    [
        ([], 0, 0),
        ([0, -1, INT64_MIN], 0, 0),
        ([INT64_MAX] * 3, 0, 3 * INT64_MAX),  # no int64 wrap
        ([INT64_MAX] * 3, INT64_MAX, 3 * INT64_MAX),
        ([INT64_MAX, 7, 2], 4, 4 + 4 + 2),
        ([3, 10], 1, 2),
    ],
)
def test_extremes(prefix, window, expected):
    for form in ("list", "tuple", "numpy", "tensor"):
        assert verify_entries_needed(as_host(prefix, form), swa_window_size=window) == expected


def test_a_need_past_every_capacity_is_refused_by_ensure_capacity():
    need = verify_entries_needed([MAX_CAPACITY, 1])
    buffers = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device=DEVICE)
    with pytest.raises(ValueError, match="verify_entries must be <= 2147483647"):
        buffers.ensure_capacity(verify_entries=need)


def test_uint64_and_narrow_arrays():
    assert verify_entries_needed(np.array([2**63 - 1, 5], dtype=np.uint64)) == 2**63 + 4
    assert verify_entries_needed(np.array([1, 2, 3], dtype=np.int8), swa_window_size=2) == 5
    assert verify_entries_needed(torch.tensor([200, 3], dtype=torch.uint8)) == 203
    with pytest.raises(ValueError, match=r"prefix_lens\[0\] must be in"):
        verify_entries_needed(np.array([2**64 - 1], dtype=np.uint64))


@pytest.mark.gpu
def test_a_cuda_tensor_is_refused_not_read():
    with pytest.raises(ValueError, match=r"prefix_lens must be host data .* got a tensor on cuda"):
        verify_entries_needed(torch.ones(3, dtype=torch.int64, device="cuda"))
