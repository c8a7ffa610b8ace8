"""The kernels' launch constants: one frozen ``LaunchConfig``, swapped as a whole by
``launch_config``; every kernel gives the references' results under another one."""

from __future__ import annotations

import attrs
import pytest
import torch

from kv_canary_buffers import PlanBuffers, plan_reference
from kv_canary_buffers.layout import SCAN_BLOCK
from kv_canary_demo import SimConfig, Simulation
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import (
    DEFAULT_LAUNCH_CONFIG,
    LaunchConfig,
    active_launch_config,
    device_config,
    launch_config,
)
from tests.helpers.plan import assert_buffers_equal, make_rows, make_tables, poison

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

SMALL_BLOCKS = dict(
    small_row_tiles=(16, 64),
    small_entry_block=64,
    small_entry_warps=4,
    entry_block=512,
    lut_entry_block=256,
    row_window=16,
    sum_chunk=256,
    write_rows=64,
    write_warps=2,
    verify_block=64,
    verify_warps=2,
    real_kv_chunk=8,
)


def test_launch_config_swaps_the_whole_config_and_restores_it():
    assert active_launch_config() is DEFAULT_LAUNCH_CONFIG
    default = device_config(DEVICE)
    assert default.launch is DEFAULT_LAUNCH_CONFIG
    with launch_config(entry_block=512) as config:
        assert active_launch_config() is config
        assert config == attrs.evolve(DEFAULT_LAUNCH_CONFIG, entry_block=512)
        inside = device_config(DEVICE)
        assert inside.launch is config and inside.variant != default.variant
        with launch_config(DEFAULT_LAUNCH_CONFIG, row_window=64):
            assert active_launch_config().entry_block == DEFAULT_LAUNCH_CONFIG.entry_block
        assert active_launch_config() is config
        with launch_config(config) as same:  # an equal config: the same compiled variants
            assert device_config(DEVICE).variant == inside.variant and same == config
    assert active_launch_config() is DEFAULT_LAUNCH_CONFIG
    assert device_config(DEVICE).launch is DEFAULT_LAUNCH_CONFIG


def test_launch_config_restores_after_an_error():
    with pytest.raises(RuntimeError, match="boom"), launch_config(verify_block=64):
        raise RuntimeError("boom")
    assert active_launch_config() is DEFAULT_LAUNCH_CONFIG


@pytest.mark.parametrize(
    "changes, rule",
    [
        (dict(entry_block=384), "power of two"),
        (dict(lut_entry_block=128), "multiples of ROW_HINT_STRIDE"),
        (dict(small_row_tiles=(512, 256)), "ascend below SCAN_BLOCK"),
        (dict(small_row_tiles=(256, SCAN_BLOCK)), "ascend below SCAN_BLOCK"),
        (dict(verify_block=16), "multiple of 32"),
        (dict(real_kv_chunk=64), "8, 16 or 32"),
        (dict(write_chain_tokens=-1), r"write_chain_tokens must lie in \[0, 2\*\*31\)"),
        (dict(write_chain_tokens=1 << 31), r"write_chain_tokens must lie in \[0, 2\*\*31\)"),
        (dict(write_chain_programs=0), "write_chain_programs is below 1"),
        (dict(write_chain_sleep_ns=-1), r"write_chain_sleep_ns must lie in \[0, 2\*\*20\]"),
        (dict(write_chain_sleep_ns=(1 << 20) + 1), r"write_chain_sleep_ns must lie in"),
        (dict(write_chain_maxnreg=8), r"write_chain_maxnreg must be 0 or lie in \[16, 255\]"),
        (dict(write_chain_maxnreg=256), r"write_chain_maxnreg must be 0 or lie in"),
    ],
)
def test_a_config_the_kernels_cannot_take_is_refused(changes, rule):
    with pytest.raises(ValueError, match=f"kv-canary: invalid LaunchConfig: .*{rule}"):
        LaunchConfig(**changes)
    with pytest.raises(ValueError), launch_config(**changes):
        pass
    assert active_launch_config() is DEFAULT_LAUNCH_CONFIG


def test_a_chain_sleep_or_register_cap_needs_the_gpu():
    # nanosleep and maxnreg have no interpreter support: refused there, taken on a GPU
    from kv_canary_kernels.config import INTERPRETING

    if INTERPRETING:
        with pytest.raises(ValueError, match="be 0 under the interpreter"):
            LaunchConfig(write_chain_sleep_ns=256)
        with pytest.raises(ValueError, match="be 0 under the interpreter"):
            LaunchConfig(write_chain_maxnreg=32)
    else:
        assert LaunchConfig(write_chain_sleep_ns=256).write_chain_sleep_ns == 256
        assert LaunchConfig(write_chain_maxnreg=32).write_chain_maxnreg == 32
    assert LaunchConfig(write_chain_sleep_ns=0, write_chain_maxnreg=0) == DEFAULT_LAUNCH_CONFIG


def test_the_config_is_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        DEFAULT_LAUNCH_CONFIG.entry_block = 512  # type: ignore[misc]


@pytest.mark.parametrize("bs", [20, SCAN_BLOCK + 40], ids=["small", "large"])
@pytest.mark.parametrize("lut", [False, True], ids=["full", "swa"])
def test_the_plan_under_small_blocks_equals_the_reference(bs, lut, large_path):
    gen = torch.Generator().manual_seed(bs + lut)
    tables = make_tables(
        gen, rows=bs + 1, max_seq_len=48, n_slots=4000, lut=lut, pool_cols=40, device="cpu"
    )
    rows = make_rows(gen, bs=bs, rows=bs + 1, max_prefix=40, pool_cols=40, device="cpu")
    kwargs = {k: v.to(DEVICE) for k, v in {**tables, **rows}.items() if v is not None}
    kwargs["swa_window_size"] = 24 if lut else 0
    ref = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 48, device=DEVICE)
    plan_reference(ref, **kwargs)
    got = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 48, device=DEVICE)
    poison(got)
    with launch_config(**SMALL_BLOCKS):
        launch_plan(got, **kwargs)
    assert_buffers_equal(got, ref, bs)


def test_write_and_verify_under_small_blocks_equal_the_references():
    """The toy engine with the kernels compares every plan and both stores with the
    references' at every step."""
    config = SimConfig.for_max_seq_len(16, max_batch=8, device=str(DEVICE), kernels=True, seed=3)
    with launch_config(**SMALL_BLOCKS):
        sim = Simulation(config)
        for _ in range(4):
            sim.step()
    s = sim.stats
    assert s.plan_mismatches == 0 and s.store_mismatches == 0, sim.messages
    assert not s.plan_flags and not s.canary_flags


def test_real_kv_all_under_another_chunk_equals_the_reference():
    """Mode ALL reads a slot ``real_kv_chunk`` words at a time: 8-word chunks (and a last,
    partial one) give the reference's hashes in the write and the verify."""
    from kv_canary_buffers import RealKV, RealKVMode, verify_reference, write_reference
    from kv_canary_kernels import launch_verify, launch_write
    from tests.helpers.canary import (
        make_source,
        new_plan,
        new_store,
        set_verify_plan,
        set_write_plan,
    )

    gen = torch.Generator().manual_seed(5)
    sources = [make_source(gen, 8, 4 * 160, device=DEVICE) for _ in range(2)]
    real_kv = RealKV(
        mode=RealKVMode.ALL, sources=sources, page_size=4, bytes_per_token=160, read_bytes=144
    )
    stores = []
    for write, verify in ((write_reference, verify_reference), (launch_write, launch_verify)):
        store, plan = new_store(device=DEVICE), new_plan(device=DEVICE)
        set_write_plan(plan, [0, 3, 5], [-1, -1])
        set_verify_plan(plan, [3, 4, 9, 10], [-1, 3, -1, 9], [0, 1, 0, 1])
        ids = torch.arange(5, device=DEVICE) + 100
        with launch_config(real_kv_chunk=8):
            write(store, plan, input_ids=ids, positions=ids % 2, out_cache_loc=ids - 97,
                  real_kv=real_kv)  # fmt: skip
            sources[0][2].add_(1)  # slot 9's bytes (page 2) change: a REAL_KV row
            verify(store, plan, real_kv=real_kv)
            sources[0][2].sub_(1)
        stores.append(store)
    ref, got = stores
    assert torch.equal(got.records, ref.records)
    rows = sorted(map(tuple, got.violations[: int(got.violation_count)].tolist()))
    assert rows == sorted(map(tuple, ref.violations[: int(ref.violation_count)].tolist()))
    assert int(ref.violation_count) >= 1


@pytest.mark.parametrize(
    "changes",
    [
        dict(verify_programs_per_sm=0),  # a grid of 0: verify would launch nothing
        dict(entry_programs_per_sm=0),
        dict(small_programs_per_sm=0),
        dict(interpreter_programs=-1),
        dict(verify_block=96),  # a multiple of 32, not a power of two
        dict(verify_warps=3),
        dict(scan_warps=6),
        dict(write_rows=32, write_warps=2),
    ],
)
def test_values_that_would_skip_work_or_fail_mid_plan_are_refused(changes):
    with pytest.raises(ValueError, match="kv-canary: invalid LaunchConfig"):
        LaunchConfig(**changes)


@pytest.mark.parametrize("changes", [dict(write_rows=True), dict(entry_block=1024.0)])
def test_fields_must_be_exact_ints(changes):
    name = next(iter(changes))
    with pytest.raises(TypeError, match=f"kv-canary: invalid LaunchConfig: {name} must be int"):
        LaunchConfig(**changes)
