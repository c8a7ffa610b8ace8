"""``launch_load_token_slots``: an engine's per-token slot lists into ``req_to_token``, in
one launch (the semantics, validation and torch reference: :mod:`kv_canary_buffers.tables`).

The canary runtime loads a :class:`~kv_canary_engines.TokenSlots` step's table with it on
CUDA: the per-token scatter index it replaces was built on the host with numpy over every
position the step's rows attend to, staged, and followed by a saturating cast and an
``index_put_`` (three torch calls beside the numpy); here the rows' starts (``bs + 1``
int64) are the only host array, and one program per (row, block of positions) copies,
saturates and stores. The step's pool scatter and its inputs' widening ride on the same
launch (programs after the table's), so that the runtime's step makes one launch where it
made a load, an ``index_put_`` and a cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kv_canary_buffers.layout import INT32_MAX, INT32_MIN
from kv_canary_buffers.tables import validate_load_token_slots_args, validate_step_parts

from .fast_launch import Launcher, alignment_key, cdiv

BLOCK = 512
"""Positions a program copies."""

_INT32_MIN: tl.constexpr = tl.constexpr(INT32_MIN)
_INT32_MAX: tl.constexpr = tl.constexpr(INT32_MAX)

_RUNTIME_INTS = (
    "table_rows",
    "width",
    "slots_len",
    "limit",
    "chunks",
    "slot_programs",
    "pool_len",
    "m",
    "pool_programs",
    "n",
    "wide_stride",
)


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def load_token_slots_kernel(
    table_ptr,
    slots_ptr,
    rows_ptr,
    starts_ptr,
    pool_ptr,
    pool_index_ptr,
    pool_tokens_ptr,
    ids_ptr,
    pos_ptr,
    wide_ptr,
    table_rows: tl.int64,
    width: tl.int64,
    slots_len: tl.int64,
    limit: tl.int64,
    chunks: tl.int64,
    slot_programs: tl.int64,
    pool_len: tl.int64,
    m: tl.int64,
    pool_programs: tl.int64,
    n: tl.int64,
    wide_stride: tl.int64,
    POOL: tl.constexpr,
    WIDEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Programs ``[0, slot_programs)``: program ``b * chunks + c`` loads positions ``c *
    BLOCK ..`` of batch row ``b``; a row outside the table or a negative start writes
    nothing; no subtraction below can wrap (``0 <= lo <= hi`` once checked, ``slots_len
    >= 0``). Then (``POOL``) ``pool_programs`` programs scatter ``BLOCK`` pool entries
    each (an index outside ``[0, pool_len)`` writes nothing); then (``WIDEN``) the rest
    widen ``BLOCK`` tokens each of ``input_ids`` and ``positions`` into ``wide``'s rows."""
    pid = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK).to(tl.int64)
    if pid < slot_programs:
        b = pid // chunks
        c = pid - b * chunks
        row = tl.load(rows_ptr + b)
        lo = tl.load(starts_ptr + b)
        hi = tl.load(starts_ptr + b + 1)
        ok = (row >= 0) & (row < table_rows) & (lo >= 0)
        row = tl.where(ok, row, 0)
        lo = tl.where(ok, lo, 0)
        hi = tl.where(ok, tl.maximum(hi, lo), 0)  # a crossing list is empty: hi - lo >= 0
        count = tl.minimum(tl.minimum(hi - lo, limit), slots_len - lo)
        j = c * BLOCK + lane
        mask = ok & (j < count)
        value = tl.load(slots_ptr + lo + j, mask=mask, other=0).to(tl.int64)
        value = tl.minimum(tl.maximum(value, _INT32_MIN), _INT32_MAX).to(tl.int32)
        tl.store(table_ptr + row * width + j, value, mask=mask)
    else:
        q = pid - slot_programs
        if POOL:
            if q < pool_programs:
                i = q * BLOCK + lane
                inside = i < m
                index = tl.load(pool_index_ptr + i, mask=inside, other=-1)
                hit = inside & (index >= 0) & (index < pool_len)
                token = tl.load(pool_tokens_ptr + i, mask=hit, other=0)
                tl.store(pool_ptr + tl.where(hit, index, 0), token, mask=hit)
            q -= pool_programs
        if WIDEN:
            if q >= 0:
                t = q * BLOCK + lane
                inside = t < n
                ids = tl.load(ids_ptr + t, mask=inside, other=0).to(tl.int64)
                pos = tl.load(pos_ptr + t, mask=inside, other=0).to(tl.int64)
                tl.store(wide_ptr + t, ids, mask=inside)
                tl.store(wide_ptr + wide_stride + t, pos, mask=inside)


_LAUNCHER = Launcher(load_token_slots_kernel)


def launch_load_token_slots(
    req_to_token: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    *,
    max_len: int,
    pool: torch.Tensor | None = None,
    pool_index: torch.Tensor | None = None,
    pool_tokens: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    wide: torch.Tensor | None = None,
) -> None:
    """``req_to_token[rows[b], :n_b] = saturate_int32(slots[starts[b] : starts[b + 1]])``
    for each batch row ``b`` (``n_b`` at most ``max_len``), byte for byte
    :func:`kv_canary_buffers.load_token_slots_reference` for distinct ``rows`` (two lists
    for one row: which lands is unspecified) and distinct ``pool_index`` entries; with the
    pool scatter, ``pool.view(-1)[pool_index[i]] = pool_tokens[i]``; with the widening,
    ``wide[0, :n] = input_ids``, ``wide[1, :n] = positions`` as int64. Validates first
    (nothing is written on a rejection), then one launch on the current stream of ``bs *
    ceil(max_len / BLOCK) + ceil(m / BLOCK) + ceil(n / BLOCK)`` programs; no allocation,
    no sync.

    Args:
        req_to_token: int32 ``[table_rows, width]``, contiguous: the table written.
        slots: int32 or int64 ``[n]``, contiguous: the rows' lists, concatenated (cut at n).
        rows: int64 ``[bs]``: each list's table row.
        starts: int64 ``[bs + 1]``: list ``b`` is ``slots[starts[b] : starts[b + 1]]``.
        max_len: a host int in ``[0, width]``: the most slots written a row.
        pool, pool_index, pool_tokens: int32 ``[pool_rows, pool_width]``, int64 ``[m]``,
            int32 ``[m]``: the pool scatter (all three or none).
        input_ids, positions, wide: int32 or int64 ``[n]`` each, int64 ``[2, >= n]``: the
            widening (all three or none).
    All contiguous, on one device."""
    bs = validate_load_token_slots_args(req_to_token, slots, rows, starts, max_len)
    device = req_to_token.device
    m, n = validate_step_parts(device, pool, pool_index, pool_tokens, input_ids, positions, wide)
    table_rows, width = req_to_token.shape
    limit = min(max_len, width)
    chunks = cdiv(limit, BLOCK)
    slot_programs = bs * chunks
    pool_programs = cdiv(m, BLOCK)
    programs = slot_programs + pool_programs + cdiv(n, BLOCK)
    if programs == 0:
        return
    scatter = pool is not None
    widen = wide is not None
    # (absent parts: the table stands in for their pointers, which no program reads)
    pool_t = pool if pool is not None else req_to_token
    index_t = pool_index if pool_index is not None else req_to_token
    tokens_t = pool_tokens if pool_tokens is not None else req_to_token
    ids_t = input_ids if input_ids is not None else req_to_token
    pos_t = positions if positions is not None else req_to_token
    wide_t = wide if wide is not None else req_to_token
    tensors = (req_to_token, slots, rows, starts, pool_t, index_t, tokens_t, ids_t, pos_t, wide_t)
    _LAUNCHER.launch(
        device,
        (programs, 1, 1),
        (slots.dtype, scatter, widen, ids_t.dtype, pos_t.dtype, alignment_key(tensors)),
        (
            *tensors,
            table_rows,
            width,
            slots.shape[0],
            limit,
            max(chunks, 1),
            slot_programs,
            pool_t.numel(),
            m,
            pool_programs,
            n,
            wide_t.stride(0),
        ),
        {"POOL": scatter, "WIDEN": widen, "BLOCK": BLOCK},
        {"num_warps": 4},
    )
