"""The occupancy rule behind the verify kernel's persistent grid of one wave
(``launcher.resident_programs``), on stand-ins for a compiled kernel and a device."""

from types import SimpleNamespace

import pytest

from kv_canary_kernels import launcher

H200 = (65536, 232448, 2048)
"""Registers, shared memory bytes (a block's opt-in maximum) and threads of an H200."""


@pytest.fixture
def limits(monkeypatch):
    """A stand-in CUDA device with the H200's multiprocessor limits (a list to edit)."""
    now = list(H200)
    monkeypatch.setattr(launcher, "device_limits", lambda index: tuple(now))
    return now


def kernel(n_regs, warps=4, shared=0):
    return SimpleNamespace(n_regs=n_regs, metadata=SimpleNamespace(num_warps=warps, shared=shared))


@pytest.mark.parametrize(
    ("n_regs", "warps", "expected"),
    [
        (32, 4, 16),  # the verify variant without real-KV: 64 warps, the thread limit
        (46, 4, 10),  # PARTIAL: 46 rounds up to 48 a thread (256 a warp), 42 warps fit
        (48, 4, 10),
        (40, 4, 12),  # 1280 a warp: 51 warps
        (24, 4, 16),  # fewer registers: still at most 2048 threads
        (64, 8, 4),
        (255, 4, 2),  # 8192 a warp: 8 warps
    ],
)
def test_programs_per_multiprocessor_follow_the_occupancy_rule(limits, n_regs, warps, expected):
    assert launcher.resident_programs(kernel(n_regs, warps), 0) == expected


def test_shared_memory_limits_the_programs(limits):
    assert launcher.resident_programs(kernel(32, 4, shared=100_000), 0) == 2
    assert launcher.resident_programs(kernel(32, 4, shared=16), 0) == 16


def test_a_kernel_too_large_for_one_program_still_gets_one(limits):
    limits[0] = 1024
    assert launcher.resident_programs(kernel(255, 4), 0) == 1
