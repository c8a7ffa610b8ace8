"""Loading an engine's per-token slot lists into a ``req_to_token`` table: the validation
and the torch reference of ``kv_canary_kernels.launch_load_token_slots``.

An engine that gives its read slots as one flat list per step (transformers' ``read_index``:
every position ``0 .. P + E - 1`` of each row, rows concatenated) has them copied into the
rows of the ``req_to_token`` table the plan reads. ``starts`` (int64 ``[bs + 1]``, ``0``
first, non-decreasing) cuts ``slots`` into the rows' lists; row ``b``'s list goes to
``req_to_token[rows[b], 0 .. starts[b + 1] - starts[b] - 1]``. Each slot is saturated to
int32 (an int64 slot outside int32 becomes ``-2**31`` or ``2**31 - 1``, out of range for
every store, so the plan and the verify flag it instead of wrapping onto a real slot).

``rows`` should be distinct: two lists for one table row overwrite each other (the
reference's last wins; the kernel's order is unspecified). The data in ``rows`` and
``starts`` is the caller's (the runtime's own rows and the
lengths it checked against the table's shape): lanes whose row is outside the table,
whose position is past ``max_len`` or the table's width, or whose index is past
``slots`` write nothing and read nothing (no out-of-bounds access for any input); the
validation proves, on host numbers only, that ``max_len`` fits the table. The load has
no status word: a skipped lane is not flagged. Its one caller, the engines runtime, gives
only its own rows (inside the table, which it grows first) and starts from lengths it
checked against ``slots``, so none is skipped there; another caller must give data as
valid.

Two more parts ride on the same launch, each optional, so that a step's host-side ops
before the forward are one launch instead of three (on the H200 an op costs the engine's
GPU the 30 to 75 us of host time it waits for in a host-bound decode step):

- **the pool scatter** (``pool``, ``pool_index``, ``pool_tokens``): ``pool.view(-1)[
  pool_index[i]] = pool_tokens[i]``, the expected-token pool's updates of the step (what
  ``index_put_`` did). An index outside the pool writes nothing (the runtime's indices are
  ``row * width + position`` of rows and positions it grew the pool for).
- **the widening** (``input_ids``, ``positions``, ``wide``): ``wide[0, :n] = input_ids``,
  ``wide[1, :n] = positions`` as int64 (the write's per-token inputs: what a cast of the
  engine's int32 ``input_ids`` and ``positions`` did).
"""

from __future__ import annotations

import torch

from .checks import check_tensor
from .layout import INT32_MAX, INT32_MIN


def validate_load_token_slots_args(
    req_to_token: object, slots: object, rows: object, starts: object, max_len: object
) -> int:
    """Check the arguments of a token-slot load (module docstring); returns ``bs``."""
    if not isinstance(req_to_token, torch.Tensor):
        raise TypeError(
            f"kv-canary: req_to_token must be a torch.Tensor, got {type(req_to_token).__name__}"
        )
    device = req_to_token.device
    table = check_tensor("req_to_token", req_to_token, torch.int32, 2, device)
    if not isinstance(slots, torch.Tensor):
        raise TypeError(f"kv-canary: slots must be a torch.Tensor, got {type(slots).__name__}")
    if slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"kv-canary: slots must be an int32 or int64 tensor, got "
            f"{getattr(slots, 'dtype', type(slots).__name__)}"
        )
    check_tensor("slots", slots, slots.dtype, 1, device)
    rows_t = check_tensor("rows", rows, torch.int64, 1, device)
    starts_t = check_tensor("starts", starts, torch.int64, 1, device)
    bs = rows_t.shape[0]
    if starts_t.shape[0] != bs + 1:
        raise ValueError(
            f"kv-canary: starts must have bs + 1 = {bs + 1} entries, got {starts_t.shape[0]}"
        )
    if type(max_len) is not int or not 0 <= max_len <= table.shape[1]:
        raise ValueError(
            f"kv-canary: max_len must be an int in [0, req_to_token.shape[1] = "
            f"{table.shape[1]}], got {max_len!r}"
        )
    return bs


def validate_step_parts(
    device: torch.device,
    pool: object,
    pool_index: object,
    pool_tokens: object,
    input_ids: object,
    positions: object,
    wide: object,
) -> tuple[int, int]:
    """Check the optional pool scatter and widening (module docstring), each all or
    nothing; returns ``(m, n)``: the scatter's entries and the widened tokens (0 where
    absent)."""
    m = n = 0
    scatter = (pool, pool_index, pool_tokens)
    if any(t is not None for t in scatter):
        if any(t is None for t in scatter):
            raise ValueError(
                "kv-canary: pool, pool_index and pool_tokens must be given together, got "
                f"{', '.join(name for name, t in zip(_SCATTER, scatter) if t is not None)}"
            )
        check_tensor("pool", pool, torch.int32, 2, device)
        m = check_tensor("pool_index", pool_index, torch.int64, 1, device).shape[0]
        tokens = check_tensor("pool_tokens", pool_tokens, torch.int32, 1, device)
        if tokens.shape[0] != m:
            raise ValueError(
                f"kv-canary: pool_tokens must have pool_index's {m} entries, got {tokens.shape[0]}"
            )
    widen = (input_ids, positions, wide)
    if any(t is not None for t in widen):
        if any(t is None for t in widen):
            raise ValueError(
                "kv-canary: input_ids, positions and wide must be given together, got "
                f"{', '.join(name for name, t in zip(_WIDEN, widen) if t is not None)}"
            )
        for name, t in (("input_ids", input_ids), ("positions", positions)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in (torch.int32, torch.int64):
                raise ValueError(
                    f"kv-canary: {name} must be an int32 or int64 tensor, got "
                    f"{getattr(t, 'dtype', type(t).__name__)}"
                )
            check_tensor(name, t, t.dtype, 1, device)
        assert isinstance(input_ids, torch.Tensor) and isinstance(positions, torch.Tensor)
        n = input_ids.shape[0]
        if positions.shape[0] != n:
            raise ValueError(
                f"kv-canary: positions must have input_ids' {n} entries, got {positions.shape[0]}"
            )
        out = check_tensor("wide", wide, torch.int64, 2, device)
        if out.shape[0] != 2 or out.shape[1] < n:
            raise ValueError(
                f"kv-canary: wide must be int64 [2, >= {n}] (input_ids' entries), got shape "
                f"{tuple(out.shape)}"
            )
    return m, n


_SCATTER = ("pool", "pool_index", "pool_tokens")
_WIDEN = ("input_ids", "positions", "wide")


def load_token_slots_reference(
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
    """The torch reference of ``launch_load_token_slots`` (module docstring): the same
    writes, the same lanes skipped. A host read of ``rows``, ``starts`` and ``pool_index``
    (a reference). ``req_to_token`` int32 ``[table_rows, width]``; ``slots`` int32 or
    int64 ``[n]`` (cut at n); ``rows`` int64 ``[bs]``; ``starts`` int64 ``[bs + 1]``;
    ``max_len`` a host int in ``[0, width]``; the pool scatter: ``pool`` int32 ``[rows,
    width]``, ``pool_index`` int64 ``[m]``, ``pool_tokens`` int32 ``[m]``; the widening:
    ``input_ids`` and ``positions`` int32 or int64 ``[n]``, ``wide`` int64 ``[2, >= n]``;
    all contiguous, on one device."""
    validate_load_token_slots_args(req_to_token, slots, rows, starts, max_len)
    validate_step_parts(
        req_to_token.device, pool, pool_index, pool_tokens, input_ids, positions, wide
    )
    if pool is not None and pool_index is not None and pool_tokens is not None:
        flat = pool.view(-1)
        for i, index in enumerate(pool_index.tolist()):
            if 0 <= index < flat.shape[0]:
                flat[index] = pool_tokens[i]
    if input_ids is not None and positions is not None and wide is not None:
        n = input_ids.shape[0]
        wide[0, :n] = input_ids.to(torch.int64)
        wide[1, :n] = positions.to(torch.int64)
    table_rows, width = req_to_token.shape
    limit = min(max_len, width)
    bounds = starts.tolist()
    for b, row in enumerate(rows.tolist()):
        if not 0 <= row < table_rows:
            continue
        lo, hi = bounds[b], bounds[b + 1]
        count = max(0, min(hi - lo, limit, slots.shape[0] - lo)) if lo >= 0 else 0
        if count:
            values = slots[lo : lo + count].to(torch.int64).clamp(INT32_MIN, INT32_MAX)
            req_to_token[row, :count] = values.to(torch.int32)
