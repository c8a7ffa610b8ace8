"""Device helpers shared by the buffers and the validation: one notion of "same device"."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TypeAlias, cast

import torch

DeviceLike: TypeAlias = str | torch.device | int


def normalize_device(device: object, name: str = "device") -> torch.device:
    """``torch.device(device)`` checked for this process, with a bare ``"cuda"`` pinned to
    the current index, as tensors made there report it. An int is a CUDA index.

    Raises ``TypeError`` for a value that is not a ``str``, ``torch.device`` or int, and
    ``ValueError`` (a ``kv-canary:`` message naming the devices that work here) for a
    device torch does not know, CUDA on a machine or a torch build without it, a CUDA
    index past the last, ``meta`` (a tensor without memory: nothing could be stamped, read
    back or checked there), or another backend torch cannot allocate on here (torch's own
    errors for these are an ``AssertionError`` or a ``NotImplementedError``). Runs at
    allocation only, never at a launch."""
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ValueError(
                f"kv-canary: {name} must name a torch device such as 'cpu', 'cuda' or "
                f"'cuda:1' (devices that work here: {_working_devices()}), got {device!r}"
            ) from None
    elif not isinstance(device, bool) and hasattr(type(device), "__index__"):
        index = operator.index(device)  # type: ignore[arg-type]
        if index < 0:
            raise ValueError(
                f"kv-canary: {name} must be a CUDA index >= 0 when given as an int, got {index}"
            )
        dev = torch.device("cuda", index)
    else:
        raise TypeError(
            f"kv-canary: {name} must be a str, a torch.device or an int (a CUDA index), got "
            f"{type(device).__name__} {device!r}"
        )
    if dev.type == "cpu":
        return dev
    got = repr(device) if isinstance(device, str) else f"{device!r} ({dev})"
    if isinstance(device, torch.device):
        got = repr(str(device))
    if dev.type == "meta":
        raise ValueError(
            f"kv-canary: {name} must be a device with memory (here: {_working_devices()}), "
            f"got {got}: a meta tensor holds no data, so no record could be written, read "
            "back or checked there"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                f"this torch {torch.__version__} was built without CUDA"
                if torch.version.cuda is None
                else "CUDA is not available (torch.cuda.is_available() is False)"
            )
            raise ValueError(
                f"kv-canary: {name} must be a device this process can allocate on "
                f"(here: {_working_devices()}), got {got}: {why}"
            )
        given = cast("int | None", dev.index)  # torch's stubs say int: None for a bare "cuda"
        if given is None:
            return torch.device("cuda", torch.cuda.current_device())
        count = torch.cuda.device_count()
        if given >= count:
            raise ValueError(
                f"kv-canary: {name} must be a device this process can allocate on "
                f"(here: {_working_devices()}), got {got}: this machine has {count} "
                "CUDA device(s)"
            )
        return dev
    try:  # another backend: what torch says when it cannot allocate there
        torch.empty(0, device=dev)
    except Exception as err:
        first = (str(err).splitlines() or [""])[0].split(". ")[0]
        raise ValueError(
            f"kv-canary: {name} must be a device this process can allocate on "
            f"(here: {_working_devices()}), got {got}: torch cannot allocate there "
            f"({type(err).__name__}: {first})"
        ) from None
    return dev


def _working_devices() -> str:
    """The devices that work here, for messages: ``cpu`` and the CUDA devices."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return "cpu"
    cuda = "cuda:0" if count == 1 else f"cuda:0..cuda:{count - 1}"
    return f"cpu, cuda, {cuda}"


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
