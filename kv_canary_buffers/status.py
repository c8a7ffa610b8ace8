"""The plan's status word: one sticky bit per kind of out-of-range input data.

The Triton plan never reads outside a tensor. When the data asks it to, the read is not
made, the value it would have produced becomes the padding value (slot ``0`` for a slot,
``-1`` for an expected token) and the matching bit below is OR-ed into
``PlanBuffers.status``. Bits stay set across launches until
:meth:`PlanBuffers.take_status` reads and clears them. The torch reference raises
``ValueError`` for the same data instead.
"""

from __future__ import annotations

import enum


class PlanStatus(enum.IntFlag):
    """Bits of ``PlanBuffers.status`` (int32 ``[1]``). ``0`` means every read was in range."""

    OK = 0
    REQ_POOL_INDEX_OUT_OF_RANGE = 1 << 0
    """An active row's ``req_pool_indices[r]`` is outside ``[0, req_to_token.shape[0])``:
    its seed and every slot it would read become ``0``, its expected tokens ``-1``."""
    PREFIX_LEN_OUT_OF_RANGE = 1 << 1
    """An active row's ``prefix_lens[r]`` exceeds ``req_to_token.shape[1]``: slots at
    positions past the table's width become ``0``."""
    LUT_SLOT_OUT_OF_RANGE = 1 << 2
    """A slot looked up in ``full_to_swa_index_mapping`` is at or past its length: the
    translated slot becomes ``0``. Negative slots are never looked up."""
    POOL_ROW_OUT_OF_RANGE = 1 << 3
    """An active row's ``req_pool_indices[r]`` is outside
    ``[0, req_to_verify_expected_tokens.shape[0])``: its expected tokens become ``-1``."""
    VALID_LEN_OUT_OF_RANGE = 1 << 4
    """An active row's ``req_to_verify_expected_tokens_valid_lens[r]`` exceeds
    ``req_to_verify_expected_tokens.shape[1]``: tokens past the pool's width become ``-1``."""
