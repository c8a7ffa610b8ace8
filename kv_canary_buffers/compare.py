"""``plans_equal``: whether two buffers hold the same plan (the contract's specified part)."""

from __future__ import annotations

import torch

from .buffers import PlanBuffers

VERIFY_ENTRY_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
)


def plans_equal(a: PlanBuffers, b: PlanBuffers, bs: int) -> bool:
    """Whether ``a`` and ``b`` hold the same plan of a ``bs``-row batch: the whole
    ``write_offsets``, the first ``bs`` seeds, the three counters and, when enabled, the
    first ``verify_num_valid`` verify entries. Unspecified elements are ignored. Syncs."""
    n = int(a.verify_num_valid) if int(a.verify_enable) else 0
    return (
        torch.equal(a.write_offsets, b.write_offsets)
        and torch.equal(a.write_seed_slot_indices[:bs], b.write_seed_slot_indices[:bs])
        and torch.equal(a.write_num_valid_reqs, b.write_num_valid_reqs)
        and torch.equal(a.verify_num_valid, b.verify_num_valid)
        and torch.equal(a.verify_enable, b.verify_enable)
        and all(torch.equal(getattr(a, f)[:n], getattr(b, f)[:n]) for f in VERIFY_ENTRY_FIELDS)
    )
