"""The write-only plan (``verify=False``, docs/contract.md, "Write-only plan"): the write
plan of the full plan and no verify work at all, on every path. The property tests
(``test_property.py``, ``test_extremes.py``) draw ``verify=False`` too, against the oracle;
here the plan is compared with the full plan of the same batch, and the kernels are shown
to launch fewer programs (the small path program 0 alone, the three-launch path its seed
programs alone) and to leave every verify output as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kv_canary_kernels.plan.dispatch as plan_module
from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import SCAN_BLOCK
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import DEFAULT_LAUNCH_CONFIG, launch_config
from tests.helpers import DEVICE
from tests.helpers.plan import POISON, arena_snapshot, assert_arena_unchanged, poison

I64, I32 = torch.int64, torch.int32
VERIFY_OUTPUTS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_offsets",
)


def batch(bs: int, seed: int, lut: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows, cols = 16, 12
    rp = torch.randint(1, rows, (bs,), generator=g)
    rp[torch.rand(bs, generator=g) < 0.5] = 0
    kwargs = dict(
        req_pool_indices=rp,
        prefix_lens=torch.randint(0, cols + 1, (bs,), generator=g),
        extend_seq_lens=torch.randint(0, 4, (bs,), generator=g),
        req_to_token=torch.randint(-1, 300, (rows, cols), generator=g).to(I32),
        req_to_verify_expected_tokens=torch.randint(0, 99, (rows, cols), generator=g).to(I32),
        req_to_verify_expected_tokens_valid_lens=torch.randint(0, cols, (bs,), generator=g),
    )
    if lut:
        kwargs["swa_window_size"] = 3
        kwargs["full_to_swa_index_mapping"] = torch.randint(0, 10**6, (300,), generator=g)
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


WRITE_HALF = ("write_offsets", "write_num_valid_reqs")


@pytest.mark.parametrize("bs", [0, 7, 300, SCAN_BLOCK + 7, 2 * SCAN_BLOCK + 300])
@pytest.mark.parametrize("lut", [False, True], ids=["full", "swa"])
def test_a_write_only_plan_is_the_write_half_of_the_full_plan(plan, bs, lut, large_path):
    kwargs = batch(bs, seed=bs, lut=lut)
    caps = dict(write_req_capacity=bs + 5, verify_capacity=40 * max(bs, 1))
    full = PlanBuffers.allocate(device=DEVICE, **caps)
    plan_reference(full, **kwargs)
    assert int(full.verify_enable) == 1 and (bs == 0 or int(full.verify_num_valid) > 0)
    out = PlanBuffers.allocate(device=DEVICE, **caps)
    poison(out)
    plan(out, verify=False, **kwargs)
    for name in WRITE_HALF:
        assert torch.equal(getattr(out, name), getattr(full, name)), name
    for name in ("write_seed_slot_indices", "row_req_pool_indices"):
        assert torch.equal(getattr(out, name)[:bs], getattr(full, name)[:bs]), name
    assert (int(out.verify_num_valid), int(out.verify_enable)) == (0, 0)
    for name in VERIFY_OUTPUTS:  # no verify work: nothing of it written
        assert bool((getattr(out, name) == POISON).all()), name
    assert out.take_status() == PlanStatus.OK


def test_a_write_only_plan_never_overflows(plan):
    """``verify_capacity = 1`` and a batch of many entries: no VERIFY_OVERFLOW (the full
    plan of the same batch sets it)."""
    kwargs = batch(40, seed=1, lut=False)
    out = PlanBuffers.allocate(write_req_capacity=40, verify_capacity=1, device=DEVICE)
    plan(out, **kwargs)
    assert out.take_status() == PlanStatus.VERIFY_OVERFLOW
    plan(out, verify=False, **kwargs)
    assert out.take_status() == PlanStatus.OK
    assert (int(out.verify_num_valid), int(out.verify_enable)) == (0, 0)


def test_a_write_only_plan_checks_the_rows_as_the_full_plan_does(plan):
    """The data checks are the rows' (docs/contract.md): a prefix past the table's width
    and a negative length are refused by the reference and flagged by the kernels,
    verify or not."""
    kwargs = batch(6, seed=2, lut=False)
    kwargs["prefix_lens"] = kwargs["prefix_lens"].clone()
    kwargs["prefix_lens"][1] = 13
    kwargs["req_pool_indices"] = kwargs["req_pool_indices"].clone()
    kwargs["req_pool_indices"][[1, 2]] = 3
    kwargs["extend_seq_lens"] = kwargs["extend_seq_lens"].clone()
    kwargs["extend_seq_lens"][2] = -1
    out = PlanBuffers.allocate(write_req_capacity=6, verify_capacity=64, device=DEVICE)
    if plan is plan_reference:
        with pytest.raises(ValueError, match=r"extend_seq_lens\[2\] = -1 must be >= 0"):
            plan(out, verify=False, **kwargs)
        kwargs["extend_seq_lens"][2] = 1
        with pytest.raises(ValueError, match=r"prefix_lens\[1\] = 13 must be <="):
            plan(out, verify=False, **kwargs)
        return
    plan(out, verify=False, **kwargs)
    assert out.take_status() == (PlanStatus.PREFIX_LEN_OUT_OF_RANGE | PlanStatus.NEGATIVE_LENGTH)


@pytest.fixture
def grids(monkeypatch):
    """(launcher name, grid) of every plan kernel launched, in order."""
    seen: list[tuple[str, int]] = []
    for name in ("_SMALL", "_SUMS", "_OFFSETS", "_ENTRIES", "_LARGE"):
        launcher = getattr(plan_module, name)
        original = launcher.launch_fixed

        def spy(owner, device, grid, *args, _name=name, _original=original, **kwargs):
            seen.append((_name, grid[0]))
            return _original(owner, device, grid, *args, **kwargs)

        # setitem, not setattr: undone by deleting the instance entry (setattr on an
        # instance, undone by a pytest without the fix of its issue 10644, leaves the bound
        # method in the instance's __dict__, which shadows later patches of the class)
        monkeypatch.setitem(launcher.__dict__, "launch_fixed", spy)
    return seen


def test_the_small_path_launches_its_write_program_alone(grids):
    kwargs = batch(200, seed=3, lut=False)
    out = PlanBuffers.allocate(write_req_capacity=200, verify_capacity=10**5, device=DEVICE)
    launch_plan(out, **kwargs)
    ((name, with_verify),) = grids
    assert name == "_SMALL" and with_verify > 1
    grids.clear()
    launch_plan(out, verify=False, **kwargs)
    assert grids == [("_SMALL", 1)]


def test_the_three_launch_path_launches_its_seed_programs_alone(grids):
    bs = SCAN_BLOCK + 7
    kwargs = batch(bs, seed=4, lut=False)
    out = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=10**5, device=DEVICE)
    with launch_config(one_launch_max_rows=0):
        launch_plan(out, **kwargs)
        with_verify = dict(grids)["_ENTRIES"]
        grids.clear()
        launch_plan(out, verify=False, **kwargs)
    seed_programs = -(-bs // DEFAULT_LAUNCH_CONFIG.entry_block)
    assert [n for n, _ in grids] == ["_SUMS", "_OFFSETS", "_ENTRIES"]
    assert dict(grids)["_ENTRIES"] == seed_programs < with_verify


def test_the_one_launch_path_sizes_its_workers_without_the_verify_capacity(grids):
    bs = SCAN_BLOCK + 7
    kwargs = batch(bs, seed=5, lut=False)
    out = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=10**5, device=DEVICE)
    with launch_config(interpreter_programs=8):  # (the GPU's own count is larger)
        launch_plan(out, **kwargs)
        launch_plan(out, verify=False, **kwargs)
    (n1, with_verify), (n2, without) = grids
    assert n1 == n2 == "_LARGE" and without < with_verify


@pytest.mark.parametrize("value", [0, 1, None, "no", np.bool_(False), torch.tensor(False)])
def test_verify_must_be_a_bool(plan, value):
    out = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=8, device=DEVICE)
    poison(out)
    before = arena_snapshot(out)
    with pytest.raises(TypeError, match="kv-canary: verify must be a bool, got"):
        plan(out, verify=value, **batch(3, seed=6, lut=False))
    assert_arena_unchanged(out, before)
