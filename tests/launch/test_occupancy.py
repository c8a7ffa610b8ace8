"""The occupancy rule behind the verify kernel's persistent grid of one wave
(``launcher.resident_programs``), on stand-ins for a compiled kernel and a device, and
the launcher's memory of a variant that came back uncompiled."""

from types import SimpleNamespace

import pytest

from kv_canary_kernels import fast_launch as launcher

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


def test_a_variant_without_a_compiled_kernel_warms_up_once(monkeypatch):
    """A Triton compile hook may return no compiled kernel from ``warmup``: the launcher
    then leaves the grid to the config's bound (None) and remembers it, instead of warming
    the variant up again at every launch."""
    import contextlib

    import torch

    calls = []

    def warmup(*args, **kwargs):
        calls.append(kwargs)
        return object()  # no _init_handles: not a compiled kernel

    monkeypatch.setattr(launcher, "INTERPRETING", False)
    monkeypatch.setattr(launcher.torch.cuda, "device", lambda index: contextlib.nullcontext())
    fake = launcher.Launcher(SimpleNamespace(warmup=warmup))
    device = torch.device("cuda", 0)
    for _ in range(3):
        assert fake.programs_per_sm(device, "key", (), {"BLOCK": 128}, {"num_warps": 4}) is None
    assert len(calls) == 1
    assert calls[0] == {"grid": (1,), "BLOCK": 128, "num_warps": 4}
