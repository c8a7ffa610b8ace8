"""Per-device launch settings of the write and verify kernels, read once per device."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""Read once at import, as Triton does: the interpreter can't be switched on later."""

REAL_KV_CHUNK = 16
"""Words (8 bytes) of a slot that the real-KV hash of mode ALL reads at once, per source:
8, 16 or 32 (a tile of [slots, REAL_KV_CHUNK] words, coalesced across the warp)."""

INTERPRETER_PROGRAMS = 2
"""Programs of a persistent grid under the interpreter, where each costs host time."""


class DeviceConfig(NamedTuple):
    multiprocessors: int
    """Streaming multiprocessors (a stand-in under the interpreter)."""


def device_config(device: torch.device) -> DeviceConfig:
    """The device's settings; a ``kv-canary:`` error where Triton cannot run."""
    config = _CONFIGS.get(device)
    if config is None:
        config = _CONFIGS[device] = _read_config(device)
    return config


_CONFIGS: dict[torch.device, DeviceConfig] = {}


def _read_config(device: torch.device) -> DeviceConfig:
    if INTERPRETING:
        return DeviceConfig(INTERPRETER_PROGRAMS)
    if device.type != "cuda":
        raise RuntimeError(
            f"kv-canary: the Triton kernels need a CUDA device, got {device}; on the CPU use "
            "the torch references (plan_reference, write_reference, verify_reference), or "
            "set TRITON_INTERPRET=1 before triton is first imported to run the kernels "
            "in Triton's interpreter"
        )
    return DeviceConfig(torch.cuda.get_device_properties(device).multi_processor_count)
