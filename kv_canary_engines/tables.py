"""The slots a step's rows attend to, as an engine holds them, and their expansion into the
per-token ``req_to_token`` table the plan reads.

Engines keep per-request **block tables** (vLLM's ``block_table``, transformers' decode
fast path) or per-token **slot lists** (transformers' ``read_index``). The runtime plans a
:class:`BlockTable` directly (``launch_plan(block_table=..., page_size=...)``) and loads
:class:`TokenSlots` into its ``req_to_token`` (int32 ``[rows, max_seq_len]``, a slot per
request row and position) with ``launch_load_token_slots`` on CUDA, or a scatter
elsewhere. :func:`expand_into_req_to_token` turns either form into a ``req_to_token``
table on the device, with no sync, for a caller that wants the per-token table itself
(the runtime does not use it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

_INT_DTYPES = (torch.int32, torch.int64)


def _int_tensor(
    name: str, ndim: int
) -> Callable[[object, attrs.Attribute[torch.Tensor], torch.Tensor], None]:
    """An attrs validator: an int32 or int64 tensor of ``ndim`` dimensions."""

    def check(_instance: object, _attribute: attrs.Attribute[torch.Tensor], value: object) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in _INT_DTYPES or value.dim() != ndim:
            raise ValueError(
                f"kv-canary: {name} must be an int32 or int64 tensor of {ndim} dimension(s), "
                f"got {value.dtype} of shape {tuple(value.shape)}"
            )

    return check


@attrs.frozen(kw_only=True)
class BlockTable:
    """Per batch row, the canary block ids of its pages: ``table[b, j]`` is the block that
    holds positions ``[j * page_size, (j + 1) * page_size)`` of batch row ``b`` (slot
    ``block * page_size + pos % page_size``, ``page_size`` from the group). int32 or int64
    ``[bs, max_blocks]`` on the group's device, in batch order; entries past a row's length
    are never read."""

    table: torch.Tensor = attrs.field(validator=_int_tensor("BlockTable.table", 2))


@attrs.frozen(kw_only=True)
class TokenSlots:
    """Per batch row, the canary slot of every position ``0 .. P + E - 1`` (its prefix and
    this step's tokens), the rows' lists concatenated in batch order: int32 or int64
    ``[sum(P + E)]`` on the group's device (a longer tensor is fine: the tail is not read)."""

    slots: torch.Tensor = attrs.field(validator=_int_tensor("TokenSlots.slots", 1))


SlotTable = BlockTable | TokenSlots
"""What a step gives per KV group: the slots of every position its rows attend to."""


def expand_into_req_to_token(
    req_to_token: torch.Tensor,
    table: SlotTable,
    *,
    rows: torch.Tensor,
    lengths: Sequence[int],
    page_size: int,
) -> None:
    """Write ``req_to_token[rows[b], :lengths[b]]`` from ``table`` for each batch row ``b``.

    ``rows`` is int64 ``[bs]`` on the device (the runtime's request rows, never 0);
    ``lengths`` the host list ``P + E`` per row (no device read: the sizes of every op
    here come from it). Positions past a row's length are left as they were (the plan
    never reads them). One pass over the step's tokens, on the current stream; no sync.
    """
    bs = len(lengths)
    if bs == 0:
        return
    device = req_to_token.device
    width = max(lengths)
    if width == 0:
        return
    lens = torch.tensor(lengths, dtype=torch.int64).to(device, non_blocking=True)
    if isinstance(table, BlockTable):
        blocks = table.table
        if blocks.shape[0] < bs:
            raise ValueError(
                f"kv-canary: the block table has {blocks.shape[0]} rows for a batch of {bs}"
            )
        need = -(-width // page_size)
        if blocks.shape[1] < need:
            raise ValueError(
                f"kv-canary: the block table has {blocks.shape[1]} blocks a row, a row of "
                f"{width} positions needs {need} (page_size {page_size})"
            )
        pos = torch.arange(width, device=device)
        slot = blocks[:bs, pos // page_size].to(torch.int64) * page_size + pos % page_size
        keep = pos.unsqueeze(0) < lens.unsqueeze(1)
        row_of = rows.unsqueeze(1).expand(bs, width)[keep]
        req_to_token[row_of, pos.expand(bs, width)[keep]] = slot[keep].to(req_to_token.dtype)
        return
    total = sum(lengths)
    if table.slots.shape[0] < total:
        raise ValueError(
            f"kv-canary: TokenSlots.slots has {table.slots.shape[0]} slots, the rows' "
            f"lengths need {total}"
        )
    batch_row = torch.repeat_interleave(torch.arange(bs, device=device), lens, output_size=total)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(total, device=device) - starts[batch_row]
    req_to_token[rows[batch_row], pos] = table.slots[:total].to(req_to_token.dtype)
