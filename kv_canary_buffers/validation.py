"""Host-side checks of one plan call: the one module both plan paths run first.

Everything that can be known without reading tensor data is checked here, before either
path writes a byte: the buffers object, each tensor's dtype, rank, contiguity and device,
per-row lengths, ``bs`` against the capacity, the window, the LUT and the token pool.
Nothing is cast or copied to make an input fit (a cast allocates, and an allocation breaks
graph replay). Every message starts with ``kv-canary:`` and names the argument, what was
expected and what was given.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch

from .buffers import PlanBuffers
from .devices import device_predicate
from .layout import LUT_DTYPE, REQ_TO_TOKEN_DTYPE, ROW_DTYPE, TOKEN_POOL_DTYPE


class PlanArgs(NamedTuple):
    """The validated arguments of one plan call, as both plan paths consume them.

    A NamedTuple rather than an attrs class: it is built at every launch, and a tuple
    is the cheapest immutable record to build."""

    bs: int
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    req_to_token: torch.Tensor
    swa_window_size: int
    full_to_swa_index_mapping: Optional[torch.Tensor]
    req_to_verify_expected_tokens: Optional[torch.Tensor]
    req_to_verify_expected_tokens_valid_lens: Optional[torch.Tensor]
    kv_token_id_vs_position_offset: int


_SHAPE_DOC = {
    "req_to_token": "[rows, max_seq_len]",
    "full_to_swa_index_mapping": "[lut_len]",
    "req_to_verify_expected_tokens": "[pool_rows, pool_cols]",
}


OnDevice = Callable[[torch.Tensor], bool]


def check_tensor(
    name: str, t: object, dtype: torch.dtype, ndim: int, device: torch.device,
    on_device: Optional[OnDevice] = None,
) -> torch.Tensor:
    """Check one input tensor's type, dtype, rank, device and contiguity.
    ``on_device`` is ``device_predicate(device)``, passed in when the caller has it."""
    if on_device is None:
        on_device = device_predicate(device)
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is dtype
        and t.dim() == ndim
        and on_device(t)
        and t.is_contiguous()
    ):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(
            f"kv-canary: {name} must have dtype {dtype}, got {t.dtype} "
            "(nothing is cast: convert it once where it is allocated)"
        )
    if t.dim() != ndim:
        shape = _SHAPE_DOC.get(name, "[bs]")
        raise ValueError(
            f"kv-canary: {name} must be {ndim}-D {shape}, got {t.dim()}-D shape {tuple(t.shape)}"
        )
    if not on_device(t):
        raise ValueError(
            f"kv-canary: {name} must be on the buffers' device {device}, got {t.device}"
        )
    raise ValueError(f"kv-canary: {name} must be contiguous, got strides {t.stride()}")


def check_row_tensor(
    name: str, t: object, bs: int, device: torch.device, on_device: Optional[OnDevice] = None
) -> torch.Tensor:
    """Check a per-row int64 ``[bs]`` input."""
    if on_device is None:
        on_device = device_predicate(device)
    # Fast path (every launch): one shape read covers the rank and the length.
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is ROW_DTYPE
        and t.shape == (bs,)
        and on_device(t)
        and t.is_contiguous()
    ):
        return t
    tensor = check_tensor(name, t, ROW_DTYPE, 1, device, on_device)
    raise ValueError(
        f"kv-canary: {name} must have length bs = len(req_pool_indices) = {bs}, "
        f"got {tensor.shape[0]}"
    )


def check_int(name: str, value: object, *, minimum: Optional[int] = None) -> int:
    """Check a Python int argument (bools are refused), optionally ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"kv-canary: {name} must be >= {minimum}, got {value}")
    return value


def check_buffers(buffers: object) -> PlanBuffers:
    """Accept only the library's own :class:`PlanBuffers`, re-checked."""
    if not isinstance(buffers, PlanBuffers):
        raise TypeError(
            "kv-canary: buffers must be a kv_canary_buffers.PlanBuffers "
            f"(build one with PlanBuffers.allocate), got {type(buffers).__name__}"
        )
    buffers.check()
    return buffers


def validate_plan_args(
    buffers: object,
    *,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: Optional[torch.Tensor] = None,
    req_to_verify_expected_tokens: Optional[torch.Tensor] = None,
    req_to_verify_expected_tokens_valid_lens: Optional[torch.Tensor] = None,
    kv_token_id_vs_position_offset: int = 0,
) -> PlanArgs:
    """Run every host-side check of ``docs/contract.md`` and return the arguments.

    Raises ``TypeError`` for an object of the wrong type (``buffers`` not a
    :class:`PlanBuffers`, a tensor argument that is not a tensor, a non-int scalar) and
    ``ValueError`` for everything else. Reads no tensor data and never syncs.
    """
    bufs = check_buffers(buffers)
    device = bufs.device
    on = device_predicate(device)
    check_tensor("req_pool_indices", req_pool_indices, ROW_DTYPE, 1, device, on)
    bs = req_pool_indices.shape[0]
    check_row_tensor("prefix_lens", prefix_lens, bs, device, on)
    check_row_tensor("extend_seq_lens", extend_seq_lens, bs, device, on)
    if bs > bufs.write_req_capacity:
        raise ValueError(
            f"kv-canary: bs = len(req_pool_indices) must be <= write_req_capacity, got {bs} > "
            f"{bufs.write_req_capacity}; grow the buffers with PlanBuffers.resize() or "
            "PlanBuffers.ensure_capacity()"
        )
    check_tensor("req_to_token", req_to_token, REQ_TO_TOKEN_DTYPE, 2, device, on)
    window = check_int("swa_window_size", swa_window_size, minimum=0)
    if full_to_swa_index_mapping is not None:
        check_tensor(
            "full_to_swa_index_mapping", full_to_swa_index_mapping, LUT_DTYPE, 1, device, on
        )
    elif window > 0:
        raise ValueError(
            f"kv-canary: full_to_swa_index_mapping must be given when swa_window_size > 0, "
            f"got None with swa_window_size = {window}"
        )
    pool = req_to_verify_expected_tokens
    valid_lens = req_to_verify_expected_tokens_valid_lens
    if pool is not None:
        check_tensor("req_to_verify_expected_tokens", pool, TOKEN_POOL_DTYPE, 2, device, on)
        if valid_lens is None:
            raise ValueError(
                "kv-canary: req_to_verify_expected_tokens_valid_lens must be given with "
                "req_to_verify_expected_tokens, got None"
            )
        check_row_tensor("req_to_verify_expected_tokens_valid_lens", valid_lens, bs, device, on)
    elif valid_lens is not None:
        raise ValueError(
            "kv-canary: req_to_verify_expected_tokens_valid_lens must be None when "
            "req_to_verify_expected_tokens is None, got a tensor"
        )
    offset = check_int("kv_token_id_vs_position_offset", kv_token_id_vs_position_offset)
    return PlanArgs(
        bs, req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, window,
        full_to_swa_index_mapping, pool, valid_lens, offset,
    )
