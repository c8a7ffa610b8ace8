"""The real-KV arguments of the write and verify kernels: a ``RealKV``'s source table and
its number of rows (``kv_canary_buffers.real_kv``, ``layout.SOURCE_TABLE_COLUMNS``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from kv_canary_buffers.real_kv import RealKVMode

from .constants import PARTIAL_WIDE


class SourceArgs(NamedTuple):
    table: torch.Tensor
    """The source table (int64 ``[num_sources, 6]``, the ``RealKV``'s own); without
    sources a stand-in tensor, never read."""
    num_sources: int
    mode: int
    """The kernels' ``MODE``: the ``RealKVMode`` (0, no hash, compiles the kernels without
    the real-KV code), but ``constants.PARTIAL_WIDE`` for PARTIAL over more than two
    sources (four a step; two a step keeps the registers, and the occupancy, of the
    common one or two sources)."""
    covers: int
    """Slots every source covers (``min(rows * page_size)``): validated ``>= num_slots``."""


def source_args(real_kv: Any, stand_in: torch.Tensor) -> SourceArgs:
    """The kernels' real-KV arguments of a validated ``RealKV`` (or None: ``stand_in``
    fills the table's place). Also takes ``kv_canary_kernels.compiled``'s stand-in for a
    ``RealKV`` over copies of its sources, which has a table of its own. A table is 16-byte
    aligned (a fresh allocation): it adds nothing to the alignment part of a variant's key."""
    if real_kv is None:
        return SourceArgs(stand_in, 0, 0, 0)
    table = real_kv._source_table
    count = table.shape[0]
    mode = int(real_kv.mode)
    if mode == PARTIAL and count > 2:
        mode = PARTIAL_WIDE
    return SourceArgs(table, count, mode, real_kv._covers)


PARTIAL = int(RealKVMode.PARTIAL)
