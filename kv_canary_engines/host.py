"""The step's host arrays in one transfer.

The runtime builds every per-row and per-token array a step needs (the plan's rows and
lengths, the expected tokens and positions, the pool's and the token tables' scatter
indices) from host numbers with numpy, and :func:`to_device` moves them all with one copy:
one int64 buffer, each array at a 16-byte aligned offset (the write and verify kernels
take their fast variant only on aligned per-token inputs), in pinned memory on CUDA and
copied ``non_blocking``. No sync: torch's pinned-memory cache does not hand the buffer out
again before the copy that reads it has run. One small pageable copy per array, which is
what ``torch.tensor(list).to(device)`` costs, becomes one pinned copy per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_ALIGN_WORDS = 2
"""16 bytes, in int64 words."""


def _words(a: np.ndarray) -> int:
    """int64 words of ``a``, rounded up to a 16-byte boundary."""
    words = -(-a.nbytes // 8)
    return -(-words // _ALIGN_WORDS) * _ALIGN_WORDS


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` (1-D numpy int64 or int32) on ``device``, as views of one buffer moved
    there with one copy (on the CPU, the buffer itself). Each view starts 16-byte aligned
    (relative to the buffer, which the allocators align further)."""
    offsets = []
    total = 0
    for a in arrays:
        if a.ndim != 1 or a.dtype not in (np.int64, np.int32):
            raise TypeError(
                f"kv-canary: to_device takes 1-D int64 or int32 arrays, got {a.dtype} {a.shape}"
            )
        offsets.append(total)
        total += _words(a)
    pinned = device.type == "cuda"
    host = torch.empty(max(total, _ALIGN_WORDS), dtype=torch.int64, pin_memory=pinned)
    buf = host.numpy()
    for a, at in zip(arrays, offsets):
        buf[at : at + _words(a)].view(a.dtype)[: a.size] = a
    staged = host.to(device, non_blocking=True) if device.type != "cpu" else host
    out = []
    for a, at in zip(arrays, offsets):
        if a.dtype == np.int32:
            out.append(staged[at : at + _words(a)].view(torch.int32)[: a.size])
        else:
            out.append(staged[at : at + a.size])
    return out
