"""``GraphInputs``: persistent per-row inputs for a plan captured in a CUDA graph.

A captured graph replays with the tensor addresses it was captured with, so the per-row
inputs must live in fixed, capacity-sized tensors. Capture the plan once with
``bs = capacity`` on these tensors, then before each replay call :meth:`GraphInputs.fill`
outside the graph: it copies the step's rows in place and turns every row past them into
padding (``req_pool_indices == 0``), which the plan skips whatever its lengths hold. One
captured plan then serves any batch of up to ``capacity`` rows. ``write_num_valid_reqs``
reads ``capacity`` after such a replay: padding rows are counted, as the contract says.
"""

from __future__ import annotations

from typing import Dict, Optional

import attrs
import torch

from .buffers import PlanBuffers, _check_capacity
from .devices import DeviceLike, normalize_device
from .layout import PADDING_REQ_POOL_INDEX, ROW_DTYPE
from .validation import check_row_tensor, check_tensor


@attrs.frozen(kw_only=True, eq=False)
class GraphInputs:
    """Four int64 ``[capacity]`` tensors at fixed addresses: ``req_pool_indices``,
    ``prefix_lens``, ``extend_seq_lens`` and ``valid_lens`` (the per-row valid lengths of
    the expected-token pool; pass it only when the plan uses the pool)."""

    capacity: int
    device: torch.device
    req_pool_indices: torch.Tensor = attrs.field(repr=False)
    prefix_lens: torch.Tensor = attrs.field(repr=False)
    extend_seq_lens: torch.Tensor = attrs.field(repr=False)
    valid_lens: torch.Tensor = attrs.field(repr=False)

    @classmethod
    def allocate(cls, *, capacity: int, device: DeviceLike) -> "GraphInputs":
        """Zeroed (all-padding) inputs for up to ``capacity`` rows on ``device``."""
        cap = _check_capacity("capacity", capacity)
        dev = normalize_device(device)
        zeros = [torch.zeros(cap, dtype=ROW_DTYPE, device=dev) for _ in range(4)]
        return cls(
            capacity=cap,
            device=dev,
            req_pool_indices=zeros[0],
            prefix_lens=zeros[1],
            extend_seq_lens=zeros[2],
            valid_lens=zeros[3],
        )

    @classmethod
    def for_buffers(cls, buffers: PlanBuffers) -> "GraphInputs":
        """Inputs sized ``buffers.write_req_capacity`` on ``buffers.device``."""
        return cls.allocate(capacity=buffers.write_req_capacity, device=buffers.device)

    def fill(
        self,
        *,
        req_pool_indices: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor,
        valid_lens: Optional[torch.Tensor] = None,
    ) -> None:
        """Copy one step's rows (int64 ``[n]`` each, ``n <= capacity``, on ``device``)
        into rows ``[0, n)`` in place and make rows ``[n, capacity)`` padding. Runs
        outside the graph; allocates nothing. Checks everything before it writes."""
        check_tensor("req_pool_indices", req_pool_indices, ROW_DTYPE, 1, self.device)
        n = req_pool_indices.shape[0]
        if n > self.capacity:
            raise ValueError(
                f"kv-canary: len(req_pool_indices) must be <= GraphInputs.capacity, got {n} > "
                f"{self.capacity}; allocate GraphInputs for the resized PlanBuffers"
            )
        check_row_tensor("prefix_lens", prefix_lens, n, self.device)
        check_row_tensor("extend_seq_lens", extend_seq_lens, n, self.device)
        if valid_lens is not None:
            check_row_tensor("valid_lens", valid_lens, n, self.device)
        pairs = [
            (self.req_pool_indices, req_pool_indices),
            (self.prefix_lens, prefix_lens),
            (self.extend_seq_lens, extend_seq_lens),
            (self.valid_lens, valid_lens),
        ]
        for dst, src in pairs:
            if src is not None:
                dst[:n].copy_(src)
            dst[n:].zero_()
        self.req_pool_indices[n:].fill_(PADDING_REQ_POOL_INDEX)

    def plan_kwargs(self, *, with_valid_lens: bool = False) -> Dict[str, torch.Tensor]:
        """The per-row keyword arguments of ``launch_plan``/``plan_reference``."""
        kwargs = {
            "req_pool_indices": self.req_pool_indices,
            "prefix_lens": self.prefix_lens,
            "extend_seq_lens": self.extend_seq_lens,
        }
        if with_valid_lens:
            kwargs["req_to_verify_expected_tokens_valid_lens"] = self.valid_lens
        return kwargs
