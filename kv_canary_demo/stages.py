"""The three canary stages the engine runs: the torch references or the Triton kernels."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kv_canary_buffers import plan_reference, verify_reference, write_reference


@attrs.frozen
class Stages:
    """The three canary stages: the torch references or the Triton kernels."""

    name: str
    plan: Callable[..., None]
    write: Callable[..., None]
    verify: Callable[..., None]
    kernels: bool


REFERENCE_STAGES = Stages(
    "torch references (plan_reference, verify_reference, write_reference)",
    plan_reference,
    write_reference,
    verify_reference,
    False,
)


def kernel_stages(device: torch.device) -> Stages:
    """The Triton kernels, imported here only: a run of the references never imports
    Triton (which needs ``TRITON_INTERPRET`` decided first, and is Linux-only)."""
    from kv_canary_kernels import launch_plan, launch_verify, launch_write

    where = "GPU" if device.type == "cuda" else "CPU, Triton interpreter"
    return Stages(
        f"Triton kernels (launch_plan, launch_verify, launch_write; {where})",
        launch_plan,
        launch_write,
        launch_verify,
        True,
    )
