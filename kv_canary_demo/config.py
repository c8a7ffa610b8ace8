"""What shapes a run (:class:`SimConfig`) and what it counts (:class:`Stats`)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from kv_canary_buffers import CanaryStatus, PlanStatus


@attrs.frozen(kw_only=True)
class SimConfig:
    """Everything that shapes a run; the defaults are the demo's."""

    max_batch: int = 32
    device: str = "cpu"
    seed: int = 0
    kernels: bool = False
    """Run the Triton kernels (GPU, or CPU with ``TRITON_INTERPRET=1``), else the torch
    references."""
    graphs: bool = False
    """Replay the canary from CUDA graphs (CUDA with the kernels only)."""
    tail: bool = True
    """Keep a TAIL store (written and verified after the forward)."""
    max_seq_len: int = 256
    max_prompt: int = 200
    min_output: int = 16
    max_output: int = 96
    prefill_chunk: int = 64
    max_arrivals: int = 4
    swa_window: int = 32
    verify_capacity_per_row: int = 32
    """Initial verify capacity of each group, per batch row: small, so that a long batch
    overflows (``verify_enable = 0``) and the buffers grow."""
    check_plans: bool = True
    """Compare every plan with ``plan_reference`` and the contract's invariants."""
    check_stores: bool = True
    """With the kernels: keep reference stores fed with the same inputs and compare
    records, counters and violations every step."""
    violation_capacity: int = 4096

    @classmethod
    def for_max_seq_len(cls, max_seq_len: int, **kwargs: Any) -> SimConfig:
        """Request shapes scaled from the longest request (the defaults are those of
        256): prompts up to 25/32 of it, outputs of 1/16 to 3/8 of it, prefill chunks of
        1/4, a sliding window of 1/8 and an initial verify capacity of 1/8 per row."""
        n = max_seq_len
        shapes: dict[str, Any] = dict(
            max_seq_len=n,
            max_prompt=max(1, 25 * n // 32),
            min_output=max(1, n // 16),
            max_output=max(1, 3 * n // 8),
            prefill_chunk=max(2, n // 4),
            swa_window=max(2, n // 8),
            verify_capacity_per_row=max(1, n // 8),
        )
        shapes.update(kwargs)
        return cls(**shapes)

    def __attrs_post_init__(self) -> None:
        if self.max_seq_len < 8:
            raise ValueError("kv-canary simulation: max_seq_len must be >= 8")
        if self.graphs and not (self.kernels and torch.device(self.device).type == "cuda"):
            raise ValueError("kv-canary simulation: graphs need the kernels on a CUDA device")


@attrs.define
class Stats:
    """What a run counts (the demo's summary table); every part of the engine adds to it."""

    steps: int = 0
    admitted: int = 0
    finished: int = 0
    aborted: int = 0
    rows: int = 0
    active_rows: int = 0
    prefill_rows: int = 0
    decode_rows: int = 0
    reused_slots: int = 0
    """Allocations of a slot that an earlier request had held."""
    write_entries: int = 0
    verify_entries: int = 0
    overflow_steps: int = 0
    plan_resizes: int = 0
    pool_resizes: int = 0
    captures: int = 0
    plan_mismatches: int = 0
    store_mismatches: int = 0
    plan_flags: PlanStatus = PlanStatus.OK
    canary_flags: CanaryStatus = CanaryStatus.OK
    step_us: list[float] = attrs.Factory(list)
    untimed_steps: int = 0
