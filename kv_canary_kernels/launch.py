"""``launch_plan``: the only door from a :class:`PlanBuffers` to the Triton plan."""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch
import triton

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.layout import SCAN_BLOCK
from kv_canary_buffers.validation import PlanArgs, validate_plan_args

from .entries import plan_entries_kernel
from .offsets import plan_offsets_kernel, scan_block_sums_kernel

ENTRY_BLOCK = 1024
"""Verify entries per program per step of the persistent entries loop."""
ENTRY_PROGRAMS_PER_SM = 4
"""Persistent entries grid: this many programs per multiprocessor (fewer if Cv is small)."""
INTERPRETER_ENTRY_PROGRAMS = 2
"""Entries programs under the Triton interpreter, where each program costs host time."""
_SUM_CHUNK = 1024
_OFFSETS_WARPS = 8
_ENTRIES_WARPS = 4

# Read once at import, as Triton does: the interpreter can't be switched on later.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _entry_program_cap(device: torch.device) -> int:
    if INTERPRETING:
        return INTERPRETER_ENTRY_PROGRAMS
    if device.type != "cuda":
        raise RuntimeError(
            f"kv-canary: launch_plan needs a CUDA device for buffers.device, got {device}; "
            "on the CPU use kv_canary_buffers.plan_reference (the same plan in torch), or "
            "set TRITON_INTERPRET=1 before importing kv_canary_kernels to run the kernels "
            "in Triton's interpreter"
        )
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count * ENTRY_PROGRAMS_PER_SM


def dispatch_plan(buffers: PlanBuffers, args: PlanArgs) -> None:
    """Launch the plan's kernels on validated arguments, with no check at all.

    This is the bare dispatch that :func:`launch_plan` wraps; benchmarks use it to
    measure the cost of validation. Everything else should call :func:`launch_plan`.
    """
    entry_programs = _entry_program_cap(buffers.device)
    bs = args.bs
    table = args.req_to_token
    lut = args.full_to_swa_index_mapping
    pool = args.req_to_verify_expected_tokens
    valid_lens: Optional[torch.Tensor] = args.req_to_verify_expected_tokens_valid_lens
    has_lut = lut is not None
    has_pool = pool is not None
    lut_t = lut if has_lut else buffers.dummy_int64
    pool_t = pool if has_pool else buffers.dummy_int32
    valid_t = valid_lens if valid_lens is not None else buffers.dummy_int64
    lut_len = lut.shape[0] if has_lut else 0
    pool_rows, pool_cols = pool.shape if has_pool else (0, 0)
    table_rows, table_cols = table.shape
    window = args.swa_window_size
    sums = buffers.scan_block_sums

    n_sum_blocks = 0
    if bs >= SCAN_BLOCK:
        n_sum_blocks = triton.cdiv(bs, SCAN_BLOCK)
        scan_block_sums_kernel[(n_sum_blocks,)](
            args.req_pool_indices, args.prefix_lens, args.extend_seq_lens, sums,
            bs, window, sums.shape[1],
            BLOCK=SCAN_BLOCK, num_warps=_OFFSETS_WARPS,
        )
    plan_offsets_kernel[(triton.cdiv(bs + 1, SCAN_BLOCK),)](
        args.req_pool_indices, args.prefix_lens, args.extend_seq_lens, table,
        lut_t, valid_t, sums,
        buffers.write_offsets, buffers.write_seed_slot_indices, buffers.write_num_valid_reqs,
        buffers.verify_offsets, buffers.verify_num_valid, buffers.verify_enable, buffers.status,
        bs, n_sum_blocks, sums.shape[1], buffers.write_req_capacity, buffers.verify_capacity,
        window, table_rows, table_cols, lut_len, pool_rows, pool_cols,
        HAS_LUT=has_lut, HAS_POOL=has_pool, BLOCK=SCAN_BLOCK, SUM_CHUNK=_SUM_CHUNK,
        num_warps=_OFFSETS_WARPS,
    )
    grid = min(triton.cdiv(buffers.verify_capacity, ENTRY_BLOCK), entry_programs)
    plan_entries_kernel[(grid,)](
        args.req_pool_indices, args.prefix_lens, table, lut_t, pool_t, valid_t,
        buffers.verify_offsets, buffers.verify_num_valid, buffers.verify_enable,
        buffers.verify_slot_indices, buffers.verify_expected_tokens,
        buffers.verify_expected_positions, buffers.verify_prev_slot_indices, buffers.status,
        bs, window, args.kv_token_id_vs_position_offset, table_rows, table_cols, lut_len,
        pool_rows, pool_cols,
        HAS_LUT=has_lut, HAS_POOL=has_pool, BLOCK=ENTRY_BLOCK, num_warps=_ENTRIES_WARPS,
    )


def launch_plan(
    buffers: PlanBuffers,
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
) -> None:
    """Fill ``buffers`` with the plan of one batch on the GPU, byte for byte equal to
    :func:`kv_canary_buffers.plan_reference` (same arguments, shapes and dtypes).

    Runs the shared host-side validation and ``buffers.check()`` first, so a rejected
    call writes nothing; then two or three kernel launches on the current stream. It
    never allocates device memory, never syncs and is safe to capture in a CUDA graph
    (see :class:`kv_canary_buffers.GraphInputs`). Input data outside the tables is not
    read: the affected values become padding values and a :class:`PlanStatus` bit is set
    in ``buffers.status`` (read it with ``buffers.take_status()``).

    Raises:
        TypeError: ``buffers`` is not a :class:`PlanBuffers`, or an argument has the
            wrong type.
        ValueError: a host-side check failed (the message names the argument).
        RuntimeError: Triton cannot run on ``buffers.device`` (a CPU tensor without
            ``TRITON_INTERPRET=1``): use ``plan_reference`` there.
    """
    args = validate_plan_args(
        buffers,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    )
    dispatch_plan(buffers, args)
