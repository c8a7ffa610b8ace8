"""Launch a ``@triton.jit`` kernel on a given device with little host work.

Triton's ``kernel[grid](...)`` binds and specializes every argument, hashes a cache key
and checks globals at each call: tens of microseconds per launch on a serving host, where
the launchers' budget is 30 us. The launchers here know what a compiled variant depends on
(their constexprs, each pointer's dtype and 16-byte alignment; every runtime integer is
annotated ``tl.int64`` and not specialized), so after the first launch of a variant, which
goes through Triton and compiles it, they call the compiled kernel directly. Under the
interpreter every launch goes through Triton.

The launch also runs on the device the buffers live on, whatever the current device is
(a process that touches two GPUs), on that device's current stream.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .config import INTERPRETING


def _raw_stream(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# The raw calls Triton itself uses, where this torch build has them (CUDA builds): a
# fraction of a microsecond instead of a Stream object or a device query through Python.
_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", _raw_stream)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_capturing = getattr(
    torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
)


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream, where a launch for buffers on ``device`` goes,
    is capturing a CUDA graph (False under the interpreter and off CUDA)."""
    if INTERPRETING or device.type != "cuda":
        return False
    if device.index == _current_device():
        return bool(_capturing())
    with torch.cuda.device(device.index):  # rare: buffers on a device that is not current
        return bool(_capturing())


_OUTSIDE_KERNEL = "outside of the scope of a kernel"
"""What Triton's interpreter raises (an ``InterpreterError``) when a kernel calls one of
Triton's own ``@triton.jit`` functions that was built for the GPU: ``triton`` was imported
before ``TRITON_INTERPRET=1`` was set."""

INTERPRETER_TOO_LATE = (
    "kv-canary: Triton's interpreter cannot run the kernels: triton was imported before "
    "TRITON_INTERPRET=1 was set, so its own @triton.jit functions were built for the GPU "
    "(Triton said: Cannot call @triton.jit'd outside of the scope of a kernel); set "
    "TRITON_INTERPRET=1 before anything imports triton (in the environment of the "
    "process, or first thing in the program)"
)


class Launcher:
    """A cache of compiled variants of one ``@triton.jit`` function.

    ``launch(device, grid, key, args, constexprs, options)``: ``args`` are the kernel's
    runtime arguments in order, ``constexprs`` its ``tl.constexpr`` keywords, ``options``
    Triton's launch options (``num_warps`` ...). ``key`` must identify the compiled variant
    together with :func:`alignment_key` of the tensor arguments (the caller passes it so
    that it computes no more than it needs)."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.variants: dict[Hashable, Any] = {}

    def launch(
        self,
        device: torch.device,
        grid: tuple[int, int, int],
        key: Hashable,
        args: Sequence[Any],
        constexprs: dict[str, Any],
        options: dict[str, Any],
    ) -> None:
        if INTERPRETING:
            try:
                self.fn[grid](*args, **constexprs, **options)
            except Exception as err:
                if _OUTSIDE_KERNEL in str(err):
                    raise RuntimeError(INTERPRETER_TOO_LATE) from err
                raise
            return
        if device.type != "cuda":
            raise RuntimeError(
                f"kv-canary: the Triton kernels need a CUDA device, got buffers on {device}; on "
                "the CPU use the torch references (plan_reference, write_reference, "
                "verify_reference), or set TRITON_INTERPRET=1 before triton is first "
                "imported to run the kernels in Triton's interpreter"
            )
        index = device.index
        current = _current_device()
        if current != index:
            if _capturing():
                # The launch would go to the buffers' device's own stream, outside the graph
                # (torch's ops on that device's tensors do the same); the graph would replay
                # without it.
                raise RuntimeError(
                    f"kv-canary: a CUDA graph is being captured on a stream of cuda:{current} "
                    f"but the buffers are on {device}, so the launch would run outside the "
                    f"graph; capture on a stream of {device}: torch.cuda.graph(g, "
                    f"stream=torch.cuda.Stream({device.index})) (torch.cuda.graph's default "
                    "capture stream belongs to the device that was current when the process "
                    "first used torch.cuda.graph)"
                )
            with torch.cuda.device(index):
                self._launch(index, grid, key, args, constexprs, options)
            return
        self._launch(index, grid, key, args, constexprs, options)

    def _launch(
        self,
        index: int,
        grid: tuple[int, int, int],
        key: Hashable,
        args: Sequence[Any],
        constexprs: dict[str, Any],
        options: dict[str, Any],
    ) -> None:
        full_key = (index, key)
        kernel = self.variants.get(full_key)
        if kernel is None:
            # First launch of this variant: Triton binds, compiles and launches it.
            self.variants[full_key] = self.fn[grid](*args, **constexprs, **options)
            return
        kernel.run(
            grid[0],
            grid[1],
            grid[2],
            _stream_of(index),
            kernel.function,
            kernel.packed_metadata,
            None,
            None,
            None,
            *args,
            *constexprs.values(),
        )


def alignment_key(tensors: Sequence[torch.Tensor]) -> tuple[bool, ...]:
    """Per tensor argument, whether Triton may assume it 16-byte aligned."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)
