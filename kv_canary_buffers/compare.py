"""``plans_equal``: whether two buffers hold the same plan (the contract's specified part)."""

from __future__ import annotations

import torch

from .buffers import PlanBuffers
from .checks import check_index

VERIFY_ENTRY_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
)


def plans_equal(a: PlanBuffers, b: PlanBuffers, bs: int) -> bool:
    """Whether ``a`` and ``b`` hold the same plan of a ``bs``-row batch: the whole
    ``write_offsets``, the first ``bs`` seeds and ``row_req_pool_indices``, the three
    counters and, when enabled, the first ``bs + 1`` ``verify_offsets`` and the first
    ``verify_num_valid`` verify entries. Unspecified elements are ignored. Syncs.

    ``TypeError`` unless ``a`` and ``b`` are exactly :class:`PlanBuffers` and ``bs`` an
    integer; ``ValueError`` for ``bs`` outside ``[0, write_req_capacity]`` of either."""
    for name, buffers in (("a", a), ("b", b)):
        if type(buffers) is not PlanBuffers:
            raise TypeError(
                f"kv-canary: {name} must be a kv_canary_buffers.PlanBuffers, got "
                f"{type(buffers).__name__}"
            )
        buffers.check(views=True)  # the comparison reads through the views
    rows = check_index("bs", bs)
    capacity = min(a.write_req_capacity, b.write_req_capacity)
    if not 0 <= rows <= capacity:
        raise ValueError(
            f"kv-canary: bs must be in [0, {capacity}] (the buffers' write_req_capacity), "
            f"got {rows}"
        )
    bs = rows
    n = int(a.verify_num_valid) if int(a.verify_enable) else 0
    return (
        torch.equal(a.write_offsets, b.write_offsets)
        and torch.equal(a.write_seed_slot_indices[:bs], b.write_seed_slot_indices[:bs])
        and torch.equal(a.row_req_pool_indices[:bs], b.row_req_pool_indices[:bs])
        and torch.equal(a.write_num_valid_reqs, b.write_num_valid_reqs)
        and torch.equal(a.verify_num_valid, b.verify_num_valid)
        and torch.equal(a.verify_enable, b.verify_enable)
        and (
            not int(a.verify_enable)
            or torch.equal(a.verify_offsets[: bs + 1], b.verify_offsets[: bs + 1])
        )
        and all(torch.equal(getattr(a, f)[:n], getattr(b, f)[:n]) for f in VERIFY_ENTRY_FIELDS)
    )
