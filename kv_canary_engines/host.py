"""The step's host arrays in one transfer.

The runtime builds every per-row and per-token array a step needs (the plan's rows and
lengths, the expected tokens and positions, the pool's and the token tables' scatter
indices) from host numbers with numpy, and :func:`to_device` moves them all with one copy:
one int64 buffer, each array at a 16-byte aligned offset (the write and verify kernels
take their fast variant only on aligned per-token inputs), in pinned memory on CUDA and
copied ``non_blocking``. No sync: torch's pinned-memory cache does not hand the buffer out
again before the copy that reads it has run. One small pageable copy per array, which is
what ``torch.tensor(list).to(device)`` costs, becomes one pinned copy per step.

:class:`Staging` keeps the step's device buffer and its views while the arrays' sizes
repeat (a decode step's: the batch's rows, one token each), so that such a step copies
into the same buffer and builds no tensor but the pinned one (H200, one process alone:
``to_device`` 39 us, its views 15 of it; inside an engine's step, in another call, 185).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_ALIGN_WORDS = 2
"""16 bytes, in int64 words."""

_KINDS = {"q": np.int64, "i": np.int32, "x": None}
"""The staged kinds' dtypes (``x``: an array of another dtype, which to_device refuses)."""
_KIND = {np.dtype(np.int64): "q", np.dtype(np.int32): "i"}


def _current_stream_id(index: int) -> int:
    return int(torch.cuda.current_stream(index).cuda_stream)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream_id)
"""The current stream's handle on CUDA device ``index`` (torch's raw call where this build
has it: no Stream object)."""


def _sizes(kinds: str, lengths: Sequence[int]) -> list[int]:
    """The staged buffer's layout, as ``split_with_sizes`` takes it: per array its int64
    words (an int32 array two values a word), then its padding (0 or 1 word: every array
    starts 16 bytes after the last)."""
    sizes: list[int] = []
    for kind, n in zip(kinds, lengths):
        used = n if kind == "q" else (n + 1) >> 1
        sizes += (used, used & 1)
    return sizes


def _fill(
    buf: np.ndarray, arrays: Sequence[np.ndarray | list[int]], kinds: str, sizes: list[int]
) -> None:
    """Write ``arrays`` (numpy arrays or lists of ints) into ``buf`` at the offsets of
    ``sizes`` (:func:`_sizes`); numpy converts a list as it copies it."""
    at = 0
    for i, (a, kind) in enumerate(zip(arrays, kinds)):
        used = sizes[2 * i]
        if kind == "q":
            buf[at : at + used] = a
        else:
            buf[at : at + used].view(np.int32)[: len(a)] = a
        at += used + sizes[2 * i + 1]


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` (1-D numpy int64 or int32) on ``device``, as views of one buffer moved
    there with one copy (on the CPU, the buffer itself). Each view starts 16-byte aligned
    (relative to the buffer, which the allocators align further).

    The views come from one ``split_with_sizes`` (each array's values, then its padding)
    rather than a slice each: a decode step's eight arrays cost one torch call instead of
    eight, each a few microseconds on a serving host."""
    for a in arrays:
        if a.ndim != 1 or a.dtype not in _KIND:
            raise TypeError(
                f"kv-canary: to_device takes 1-D int64 or int32 arrays, got {a.dtype} {a.shape}"
            )
    kinds = "".join(_KIND[a.dtype] for a in arrays)
    sizes = _sizes(kinds, [a.size for a in arrays])
    total = sum(sizes)
    pinned = device.type == "cuda"
    host = torch.empty(max(total, _ALIGN_WORDS), dtype=torch.int64, pin_memory=pinned)
    _fill(host.numpy(), arrays, kinds, sizes)
    staged = host.to(device, non_blocking=True) if device.type != "cpu" else host
    if total < staged.shape[0]:
        sizes.append(staged.shape[0] - total)
    views = staged.split_with_sizes(sizes)
    return [
        views[2 * i] if kind == "q" else views[2 * i].view(torch.int32)[: a.size]
        for i, (a, kind) in enumerate(zip(arrays, kinds))
    ]


class Staging:
    """:func:`to_device` for one caller's steps, keeping the last layout: when a step's
    arrays have the sizes and dtypes of the previous step's, it copies them into the
    same device buffer (one ``copy_`` from a new pinned buffer, ``non_blocking``) and
    returns the same views; otherwise it stages them anew (:func:`to_device`) and keeps
    that layout.

    Reusing the buffer needs no sync: the copy is queued on the current stream after
    everything the previous step queued there, and the runtime makes that stream wait for
    whatever read the previous step's views on another stream (the split write's chains,
    ``CanaryRuntime._join``) before the next step is staged. A step staged on another
    current stream than the last (an engine that changes streams, the overlapped begin's
    side stream) is another layout: staged anew, since the kept buffer's last readers are
    not ordered before that stream's copy. The caller must not keep a step's views past
    the next :meth:`stage`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._index = 0  # the CUDA device's index, resolved once
        if device.type == "cuda":
            self._index = torch.cuda.current_device() if device.index is None else device.index
        self._key: tuple[object, ...] | None = None
        self._buffer: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._sizes: list[int] = []
        self.reused = 0
        """Steps staged into the kept buffer (a count for tests and probes)."""

    def stage(
        self, arrays: Sequence[np.ndarray | list[int]], kinds: str | None = None
    ) -> list[torch.Tensor]:
        """Stage ``arrays``: 1-D numpy int64 / int32 arrays, or, with ``kinds`` (a letter an
        array: ``q`` int64, ``i`` int32), Python lists of ints, which the copy into the
        pinned buffer converts (a decode step's few values: no numpy array is built for
        each). Both go through :func:`_sizes` and :func:`_fill`, as :func:`to_device`."""
        if kinds is None:
            kinds = "".join(_KIND.get(a.dtype, "x") for a in arrays)  # type: ignore[union-attr]
        elif len(kinds) != len(arrays) or kinds.strip("qi"):  # (lists: int64 or int32)
            raise ValueError(
                f"kv-canary: Staging.stage kinds must be q or i an array, one an array "
                f"({len(arrays)}), got {kinds!r}"
            )
        lengths = [len(a) for a in arrays]
        key = (_raw_stream(self._index) if self.device.type == "cuda" else 0, kinds, *lengths)
        buffer = self._buffer
        if key != self._key or buffer is None:
            views = to_device(  # (an "x" array keeps its dtype: to_device refuses it)
                [np.asarray(a, dtype=_KINDS[k]) for a, k in zip(arrays, kinds)], self.device
            )
            # every view's storage is the one staged buffer: keep it whole
            self._buffer = (
                torch.empty(0, dtype=torch.int64, device=self.device).set_(
                    views[0].untyped_storage()
                )
                if views
                else None
            )
            self._key, self._views = key, views
            self._sizes = _sizes(kinds, lengths)
            return views
        host = torch.empty(
            buffer.shape[0], dtype=torch.int64, pin_memory=self.device.type == "cuda"
        )
        _fill(host.numpy(), arrays, kinds, self._sizes)
        buffer.copy_(host, non_blocking=True)
        self.reused += 1
        return self._views
