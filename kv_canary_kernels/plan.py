"""``launch_plan``: the only door from a :class:`PlanBuffers` to the Triton plan."""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import torch
import triton
from torch.compiler import is_compiling

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.layout import OFFSETS_BLOCK, ROW_HINT_STRIDE, SCAN_BLOCK
from kv_canary_buffers.validation import PlanArgs, validate_plan_args

from . import compiled
from .entries import plan_entries_kernel
from .launcher import Launcher, alignment_key
from .offsets import plan_offsets_kernel, scan_block_sums_kernel
from .small_batch import plan_small_batch_kernel

# Launch constants, chosen by `python benchmarks/bench_plan.py --tune` on an H200
# (docs/performance.md): smaller blocks win where latency or random LUT reads dominate.
ENTRY_BLOCK = 1024
"""Verify entries per block in the large path without a LUT (a multiple of ROW_HINT_STRIDE)."""
LUT_ENTRY_BLOCK = 256
"""Verify entries per block in the large path with a LUT (a multiple of ROW_HINT_STRIDE)."""
SMALL_ENTRY_BLOCK = 256
"""Verify entries per block in the small-batch path."""
SMALL_ROW_TILES = (256, 512)
"""Row tiles of the small-batch kernel below ``SCAN_BLOCK``: a batch takes the smallest
tile of at least ``bs`` rows (``SCAN_BLOCK`` past them). Every program scans a whole tile,
so a tile much larger than the batch costs time in each program. One compiled variant
per tile, never one per batch size."""
ENTRY_PROGRAMS_PER_SM = 32
"""Entries grid: up to this many programs per multiprocessor, each looping over blocks."""
SMALL_PROGRAMS_PER_SM = 2
"""The same for the small-batch path, where each program first scans all the rows: few
programs (one wave) that loop over blocks beat many that each repeat the scan."""
INTERPRETER_ENTRY_PROGRAMS = 2
"""Entries programs under the Triton interpreter, where each program costs host time."""
ROW_WINDOW = 32
"""Rows loaded at once from a block's first row in the large path: a block whose entries
span more rows searches memory instead of registers."""
_ENTRIES_OPTIONS: dict[str, Any] = {}
"""Extra Triton launch options of the entries kernels (the tuning sweep sets ``maxnreg``
and ``num_stages``)."""
ENTRY_WARPS = 8
"""Warps per program of the large path's entries kernel without a LUT."""
LUT_ENTRY_WARPS = 8
"""The same with a LUT."""
SMALL_ENTRY_WARPS = 8
"""Warps per program of the small-batch kernel."""
_SUM_CHUNK = 1024
_SCAN_WARPS = 8

# Read once at import, as Triton does: the interpreter can't be switched on later.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


class _DeviceConfig(NamedTuple):
    program_cap: int
    """Most entries programs: multiprocessors x ENTRY_PROGRAMS_PER_SM."""
    small_program_cap: int
    """Most entries programs of the small-batch path: multiprocessors x SMALL_PROGRAMS_PER_SM."""
    use_pdl: bool
    """Programmatic dependent launch (sm_90+): the offsets and entries kernels of the
    large-batch path start while their predecessor finishes and wait for it on the
    device."""
    pdl_options: dict[str, bool]


@functools.cache
def _device_config(device: torch.device) -> _DeviceConfig:
    """Per-device launch settings, read once (the first launch on a device)."""
    if INTERPRETING:
        return _DeviceConfig(INTERPRETER_ENTRY_PROGRAMS, INTERPRETER_ENTRY_PROGRAMS, False, {})
    if device.type != "cuda":
        raise RuntimeError(
            f"kv-canary: launch_plan needs a CUDA device for buffers.device, got {device}; "
            "on the CPU use kv_canary_buffers.plan_reference (the same plan in torch), or "
            "set TRITON_INTERPRET=1 before triton is first imported to run the kernels "
            "in Triton's interpreter"
        )
    props = torch.cuda.get_device_properties(device)
    use_pdl = props.major >= 9
    return _DeviceConfig(
        props.multi_processor_count * ENTRY_PROGRAMS_PER_SM,
        props.multi_processor_count * SMALL_PROGRAMS_PER_SM,
        use_pdl,
        {"launch_pdl": True} if use_pdl else {},
    )


def dispatch_plan(buffers: PlanBuffers, args: PlanArgs) -> None:
    """Launch the plan's kernels on validated arguments, with no check at all.

    ``bs < SCAN_BLOCK``: one launch (:func:`plan_small_batch_kernel`, with the smallest
    row tile of ``SMALL_ROW_TILES`` that holds the batch, else ``SCAN_BLOCK``). Otherwise
    three:
    block sums, offsets, entries. This is the bare dispatch that :func:`launch_plan`
    wraps; benchmarks use it to measure the cost of validation. Call :func:`launch_plan`.
    """
    config = _device_config(buffers.device)
    program_cap = config.program_cap
    write_capacity, verify_capacity = buffers.write_req_capacity, buffers.verify_capacity
    bs = args.bs
    table = args.req_to_token
    lut = args.full_to_swa_index_mapping
    pool = args.req_to_verify_expected_tokens
    valid_lens: torch.Tensor | None = args.req_to_verify_expected_tokens_valid_lens
    has_lut = lut is not None
    has_pool = pool is not None
    lut_t = lut if lut is not None else buffers.dummy_int64
    pool_t = pool if pool is not None else buffers.dummy_int32
    valid_t = valid_lens if valid_lens is not None else buffers.dummy_int64
    lut_len = lut.shape[0] if lut is not None else 0
    pool_rows, pool_cols = pool.shape if pool is not None else (0, 0)
    table_rows, table_cols = table.shape
    window = args.swa_window_size

    # A compiled variant depends on the constexprs below, on each pointer's 16-byte
    # alignment (the buffers' fields are aligned by construction, the inputs are the
    # caller's) and on whether each runtime int fits in int32 (Triton types it so).
    inputs = (
        args.req_pool_indices,
        args.prefix_lens,
        args.extend_seq_lens,
        table,
        lut_t,
        pool_t,
        valid_t,
    )
    offset = args.kv_token_id_vs_position_offset
    ints = (
        bs,
        write_capacity,
        verify_capacity,
        window,
        offset,
        table_rows,
        table_cols,
        lut_len,
        pool_rows,
        pool_cols,
    )
    common_key = (
        has_lut,
        has_pool,
        alignment_key(inputs),
        int_classes(ints),
        tuple(_ENTRIES_OPTIONS.items()),
    )
    device = buffers.device

    if bs < SCAN_BLOCK:
        # program 0 writes the write plan, programs 1.. the verify entries
        rows = SCAN_BLOCK
        for tile in SMALL_ROW_TILES:
            if bs <= tile:
                rows = tile
                break
        block = SMALL_ENTRY_BLOCK
        entry_grid = min(triton.cdiv(verify_capacity, block), config.small_program_cap)
        _SMALL.launch(
            device,
            (1 + entry_grid, 1, 1),
            (common_key, rows, block, SMALL_ENTRY_WARPS),
            (
                *inputs,
                buffers.write_offsets,
                buffers.write_seed_slot_indices,
                buffers.write_num_valid_reqs,
                buffers.verify_slot_indices,
                buffers.verify_expected_tokens,
                buffers.verify_expected_positions,
                buffers.verify_prev_slot_indices,
                buffers.verify_num_valid,
                buffers.verify_enable,
                buffers.status,
                *ints,
            ),
            {"HAS_LUT": has_lut, "HAS_POOL": has_pool, "ROWS": rows, "BLOCK": block},
            {"num_warps": SMALL_ENTRY_WARPS, **_ENTRIES_OPTIONS},
        )
        return

    sums = buffers.scan_block_sums
    n_sum_blocks = triton.cdiv(bs, OFFSETS_BLOCK)
    sums_ints = (bs, window, sums.shape[1], verify_capacity)
    _SUMS.launch(
        device,
        (n_sum_blocks, 1, 1),
        (common_key[2], int_classes(sums_ints), OFFSETS_BLOCK, config.use_pdl, _SCAN_WARPS),
        (args.req_pool_indices, args.prefix_lens, args.extend_seq_lens, sums, *sums_ints),
        {"BLOCK": OFFSETS_BLOCK, "USE_PDL": config.use_pdl},
        {"num_warps": _SCAN_WARPS},
    )
    offsets_ints = (bs, n_sum_blocks, sums.shape[1], write_capacity, verify_capacity, window)
    _OFFSETS.launch(
        device,
        (triton.cdiv(bs + 1, OFFSETS_BLOCK), 1, 1),
        (
            common_key[2],
            int_classes(offsets_ints),
            OFFSETS_BLOCK,
            _SUM_CHUNK,
            config.use_pdl,
            _SCAN_WARPS,
        ),
        (
            args.req_pool_indices,
            args.prefix_lens,
            args.extend_seq_lens,
            sums,
            buffers.write_offsets,
            buffers.write_num_valid_reqs,
            buffers.verify_offsets,
            buffers.verify_row_hints,
            buffers.verify_num_valid,
            buffers.verify_enable,
            *offsets_ints,
        ),
        {
            "BLOCK": OFFSETS_BLOCK,
            "SUM_CHUNK": _SUM_CHUNK,
            "HINT_STRIDE": ROW_HINT_STRIDE,
            "USE_PDL": config.use_pdl,
        },
        {"num_warps": _SCAN_WARPS, **config.pdl_options},
    )
    block, warps = (LUT_ENTRY_BLOCK, LUT_ENTRY_WARPS) if has_lut else (ENTRY_BLOCK, ENTRY_WARPS)
    seed_programs = triton.cdiv(bs, block)
    entry_grid = min(triton.cdiv(verify_capacity, block), program_cap)
    entries_ints = (
        bs,
        seed_programs,
        window,
        offset,
        table_rows,
        table_cols,
        lut_len,
        pool_rows,
        pool_cols,
    )
    _ENTRIES.launch(
        device,
        (seed_programs + entry_grid, 1, 1),
        (common_key, int_classes(entries_ints), block, ROW_WINDOW, config.use_pdl, warps),
        (
            *inputs[:4],
            lut_t,
            pool_t,
            valid_t,
            buffers.verify_offsets,
            buffers.verify_row_hints,
            buffers.verify_num_valid,
            buffers.verify_enable,
            buffers.write_seed_slot_indices,
            buffers.verify_slot_indices,
            buffers.verify_expected_tokens,
            buffers.verify_expected_positions,
            buffers.verify_prev_slot_indices,
            buffers.status,
            *entries_ints,
        ),
        {
            "HAS_LUT": has_lut,
            "HAS_POOL": has_pool,
            "BLOCK": block,
            "ROW_WINDOW": ROW_WINDOW,
            "HINT_STRIDE": ROW_HINT_STRIDE,
            "USE_PDL": config.use_pdl,
        },
        {"num_warps": warps, **config.pdl_options, **_ENTRIES_OPTIONS},
    )


_SMALL = Launcher(plan_small_batch_kernel)
_SUMS = Launcher(scan_block_sums_kernel)
_OFFSETS = Launcher(plan_offsets_kernel)
_ENTRIES = Launcher(plan_entries_kernel)


def int_classes(values: tuple[int, ...]) -> int:
    """A bit per runtime int: set when it does not fit in int32 (Triton then types it
    int64, a different compiled variant)."""
    bits = 0
    for i, v in enumerate(values):
        if not -2147483648 <= v <= 2147483647:
            bits |= 1 << i
    return bits


def launch_plan(
    buffers: PlanBuffers,
    *,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None = None,
    kv_token_id_vs_position_offset: int = 0,
) -> None:
    """Fill ``buffers`` with the plan of one batch on the GPU, byte for byte equal to
    :func:`kv_canary_buffers.plan_reference` (same arguments, shapes and dtypes).

    Runs the shared host-side validation and ``buffers.check()`` first, so a rejected
    call writes nothing; then one kernel launch (``bs < 1024``) or three on the current
    stream. It
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
    if is_compiling() and compiled.plan(  # traced by torch.compile: one custom operator
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
    ):
        return
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
