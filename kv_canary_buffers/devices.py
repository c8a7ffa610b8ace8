"""Device helpers shared by the buffers and the validation: one notion of "same device"."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TypeAlias, cast

import torch

DeviceLike: TypeAlias = str | torch.device | int


def normalize_device(device: DeviceLike) -> torch.device:
    """``torch.device(device)``, with a bare ``"cuda"`` pinned to the current index, as
    tensors made there report it."""
    dev = torch.device(device)
    index = cast("int | None", dev.index)  # torch's stubs say int: None for a bare "cuda"
    if dev.type == "cuda" and index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


@functools.cache
def device_predicate(device: torch.device) -> Callable[[torch.Tensor], bool]:
    """A test "does this tensor live on ``device``" (normalized). Much cheaper than
    comparing ``t.device``, which builds a new object: it runs for every tensor at every
    launch."""
    if device.type == "cuda":
        index = device.index
        return lambda t: t.is_cuda and t.get_device() == index
    if device.type == "cpu":
        return operator.attrgetter("is_cpu")  # a C call, no Python frame
    return lambda t: t.device == device
