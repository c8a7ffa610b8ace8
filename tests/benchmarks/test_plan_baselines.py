"""The plan baselines of ``python -m benchmarks --stage plan`` (``benchmarks/baselines.py``)
write the whole plan that ``plans_equal`` compares: on buffers poisoned first, each equals
``plan_reference`` on the benchmark's own batches (SWA off and on, the token pool on, a
padding row too). Fields a baseline forgot to write (``row_req_pool_indices`` and
``verify_offsets`` once did) show as poison here, where zeroed buffers could hide them."""

from __future__ import annotations

import pytest
import torch

from benchmarks.baselines import python_loop_plan, sglang_design_plan, torch_plan
from benchmarks.plan_cases import WINDOW, make_batch, verify_entries
from kv_canary_buffers import PlanBuffers, plan_reference, plans_equal
from tests.helpers.plan import POISON, poison

BASELINES = {
    "torch_only": torch_plan,
    "sglang_design": sglang_design_plan,
    "python_loop": python_loop_plan,
}


def _batch(bs: int, window: int, padding: bool) -> dict:
    kwargs = make_batch(bs, window=window, pool=True, device="cpu", seed=bs, mean_prefix=4)
    if padding:  # a padding row: no entries, no seed, rp 0 in row_req_pool_indices
        kwargs["req_pool_indices"][1] = 0
    return kwargs


@pytest.mark.parametrize("name", sorted(BASELINES))
@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("bs,padding", [(5, False), (7, True)])
def test_a_baseline_writes_the_whole_plan(name, window, bs, padding):
    kwargs = _batch(bs, window, padding)
    entries = verify_entries(kwargs)
    ref = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=entries, device="cpu")
    plan_reference(ref, **kwargs)
    buffers = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=entries, device="cpu")
    poison(buffers)
    BASELINES[name](buffers, **kwargs)
    assert plans_equal(buffers, ref, bs), name
    # What plans_equal compares was written, not left as poison.
    assert not (buffers.row_req_pool_indices[:bs] == POISON).any()
    assert not (buffers.verify_offsets[: bs + 1] == POISON).any()


def test_the_check_sees_a_field_left_unwritten():
    """The comparison the benchmark makes fails when one compared field keeps its poison:
    a baseline that skips ``row_req_pool_indices`` is an error row, not a figure."""
    kwargs = _batch(5, WINDOW, False)
    entries = verify_entries(kwargs)
    ref = PlanBuffers.allocate(write_req_capacity=5, verify_capacity=entries, device="cpu")
    plan_reference(ref, **kwargs)
    buffers = PlanBuffers.allocate(write_req_capacity=5, verify_capacity=entries, device="cpu")
    torch_plan(buffers, **kwargs)
    assert plans_equal(buffers, ref, 5)
    buffers.row_req_pool_indices.fill_(POISON)
    assert not plans_equal(buffers, ref, 5)
    torch_plan(buffers, **kwargs)
    buffers.verify_offsets[3] = POISON
    assert not plans_equal(buffers, ref, 5)
    assert torch.equal(ref.verify_offsets[:1], torch.zeros(1, dtype=torch.int64))
