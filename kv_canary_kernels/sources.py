"""The real-KV arguments of the write and verify kernels, computed once per ``RealKV``."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from kv_canary_buffers.real_kv import RealKV


class SourceArgs(NamedTuple):
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    """Four source pointers; absent sources repeat a present one (never read)."""
    ints: tuple[int, ...]
    """Four row strides in 8-byte words, then four row counts."""
    num_sources: int
    mode: int
    page_size: int
    bpt_words: int
    kv_words: int
    """Words hashed per slot and source."""
    dtypes: tuple[torch.dtype, ...]
    """The pointers' dtypes: part of a compiled variant's signature."""


_CACHE: weakref.WeakKeyDictionary[RealKV, SourceArgs] = weakref.WeakKeyDictionary()


def source_args(real_kv: RealKV | None, stand_in: torch.Tensor) -> SourceArgs:
    """The kernels' real-KV arguments; ``stand_in`` fills the pointers without a
    ``RealKV``. Sources are 16-byte aligned (validated), so they add nothing to the
    alignment part of a variant's key."""
    if real_kv is None:
        return SourceArgs((stand_in,) * 4, (0,) * 8, 0, 0, 1, 0, 0, (stand_in.dtype,) * 4)
    cached = _CACHE.get(real_kv)
    if cached is None:
        sources = real_kv.sources
        tensors = tuple(sources[i] if i < len(sources) else sources[0] for i in range(4))
        strides = [s.stride(0) * s.element_size() // 8 for s in sources]
        rows = [s.shape[0] for s in sources]
        pad = [0] * (4 - len(sources))
        cached = SourceArgs(
            tensors,  # type: ignore[arg-type]
            (*strides, *pad, *rows, *pad),
            len(sources),
            int(real_kv.mode),
            real_kv.page_size,
            real_kv.bytes_per_token // 8,
            real_kv.hashed_bytes // 8,
            tuple(t.dtype for t in tensors),
        )
        _CACHE[real_kv] = cached
    return cached
