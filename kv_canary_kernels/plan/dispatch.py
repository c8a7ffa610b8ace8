"""``launch_plan``: the only door from a :class:`PlanBuffers` to the Triton plan."""

from __future__ import annotations

import operator

import torch

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.layout import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    OFFSETS_BLOCK,
    PLAN_FIELDS,
    ROW_HINT_STRIDE,
    SCAN_BLOCK,
)
from kv_canary_buffers.plan import PlanArgs

from ..config import INTERPRETING, DeviceConfig, device_config
from ..fast_launch import Launcher, alignment_key, capturing, cdiv
from .common import BLOCKS, BLOCKS_POW2, REQ_TO_TOKEN
from .entries import plan_entries_kernel
from .large_batch import plan_large_batch_kernel
from .offsets import plan_offsets_kernel, scan_block_sums_kernel
from .small_batch import plan_small_batch_kernel


def dispatch_plan(buffers: PlanBuffers, args: PlanArgs) -> None:
    """Launch the plan's kernels on validated arguments, with no check at all.

    ``bs < SCAN_BLOCK``: one launch (:func:`plan_small_batch_kernel`, with the smallest
    row tile of ``LaunchConfig.small_row_tiles`` that holds the batch, else
    ``SCAN_BLOCK``). ``SCAN_BLOCK <= bs < LaunchConfig.one_launch_max_rows`` and not
    being captured in a CUDA graph: one launch (:func:`plan_large_batch_kernel`).
    Otherwise (captured, or larger) three: block sums, offsets, entries. The launch constants
    are the active :class:`~kv_canary_kernels.config.LaunchConfig`'s. This is the bare
    dispatch that :func:`launch_plan` wraps; benchmarks use it to measure the cost of
    validation. Call :func:`launch_plan`.
    """
    device = buffers.device
    try:
        dev = device_config(device)
    except RuntimeError:
        if device.type == "cuda":
            raise
        raise RuntimeError(
            f"kv-canary: launch_plan needs a CUDA device for buffers.device, got "
            f"{device}; on the CPU use kv_canary_buffers.plan_reference (the same plan "
            "in torch), or set TRITON_INTERPRET=1 before triton is first imported to run "
            "the kernels in Triton's interpreter"
        ) from None
    cfg = dev.launch
    # The buffers' own fields go as addresses once a variant has launched for these
    # buffers (Launcher.launch_fixed); a torch.compile copy's fields (compiled._Fields) as
    # tensors. What only a launch not repeated from that cache needs (the input and output
    # tensors, the constexprs, Triton's options) is built in the `build` closures, which a
    # repeated launch never calls.
    owner = buffers if type(buffers) is PlanBuffers else None
    write_capacity, verify_capacity = buffers.write_req_capacity, buffers.verify_capacity
    bs = args.bs
    lut = args.full_to_swa_index_mapping
    pool = args.req_to_verify_expected_tokens
    has_lut = lut is not None
    has_pool = pool is not None
    pool_rows, pool_cols = pool.shape if pool is not None else (0, 0)
    window = args.swa_window_size
    verify = args.verify
    block_table = args.block_table
    if block_table is None:
        table_rows, table_cols = args.req_to_token.shape  # type: ignore[union-attr]
        block_cols, page_size, page_shift, table_kind = table_cols, 1, 0, REQ_TO_TOKEN
    else:
        table_rows, block_cols = block_table.shape
        page_size = args.page_size
        # The positions the table maps, exact below int64 (clamped: no position passes it).
        table_cols = min(block_cols * page_size, INT64_MAX)
        if page_size & (page_size - 1):
            page_shift, table_kind = 0, BLOCKS
        else:
            page_shift, table_kind = page_size.bit_length() - 1, BLOCKS_POW2

    # A compiled variant depends on the constexprs below, on each pointer's 16-byte
    # alignment (the buffers' fields are aligned by construction, the inputs are the
    # caller's) and on whether each runtime int fits in int32 (Triton types it so).
    offset = args.kv_token_id_vs_position_offset
    ints = (
        bs,
        write_capacity,
        verify_capacity,
        window,
        offset,
        table_rows,
        table_cols,
        block_cols,
        page_size,
        page_shift,
        lut.shape[0] if lut is not None else 0,
        pool_rows,
        pool_cols,
    )
    if owner is not None:
        # The addresses the validation read, the buffers' own dummies where an input is
        # not given: passed in place of the tensors (Launcher.launch_fixed).
        a, dummy = args.addresses, buffers.arena.address
        d64, d32 = dummy["dummy_int64"], dummy["dummy_int32"]
        h: tuple[int, ...] = (
            *a[:3],  # type: ignore[arg-type]
            d32 if a[3] is None else a[3],
            d32 if a[4] is None else a[4],
            d64 if a[5] is None else a[5],
            d32 if a[6] is None else a[6],
            d64 if a[7] is None else a[7],
        )
        head_addresses: tuple[int, ...] | None = h
        aligned: bool | tuple[bool, ...] = (
            True  # every input 16-byte aligned, the common case
            if not (h[0] | h[1] | h[2] | h[3] | h[4] | h[5] | h[6] | h[7]) & 15
            else tuple(p % 16 == 0 for p in h)
        )
    else:
        head_addresses = None
        aligned = alignment_key(_inputs(buffers, args))

    if bs < SCAN_BLOCK:
        # program 0 writes the write plan, programs 1.. the verify entries
        rows = SCAN_BLOCK
        for tile in cfg.small_row_tiles:
            if bs <= tile:
                rows = tile
                break
        block = cfg.small_entry_block
        # A write-only plan: program 0 (the write plan) alone.
        entry_grid = min(cdiv(verify_capacity, block), dev.small_plan_programs) if verify else 0
        _SMALL.launch_fixed(
            owner,
            device,
            (1 + entry_grid, 1, 1),
            (dev.variant, has_lut, has_pool, aligned, int_classes(ints), rows, verify, table_kind),
            head_addresses,
            ints,
            lambda: (
                _inputs(buffers, args),
                (*_outputs(buffers), buffers.verify_offsets),
                {
                    "HAS_LUT": has_lut,
                    "HAS_POOL": has_pool,
                    "ROWS": rows,
                    "BLOCK": block,
                    "VERIFY": verify,
                    "TABLE": table_kind,
                },
                {"num_warps": cfg.small_entry_warps, **dev.entries_options},
            ),
        )
        return

    if bs < cfg.one_launch_max_rows and not capturing(device):
        # Eager: one launch, whose programs wait for each other on the device (the host
        # time of two launches saved; a captured graph costs none, and replays three
        # launches faster on the GPU).
        block, warps = (
            (cfg.lut_entry_block, cfg.lut_entry_warps)
            if has_lut
            else (cfg.entry_block, cfg.entry_warps)
        )
        n_scanners = cdiv(bs + 1, OFFSETS_BLOCK)
        # Enough for the entries, the seeds and the offsets' tail, whichever is largest.
        work = max(verify_capacity if verify else 0, bs, write_capacity - bs)
        workers = max(1, min(cdiv(work, block), dev.one_launch_programs))
        chunk_cols = buffers.arena.fields[_CHUNK_SUMS].shape[1]
        large_ints = (bs, n_scanners, chunk_cols, *ints[1:])
        _LARGE.launch_fixed(
            owner,
            device,
            (n_scanners + workers, 1, 1),
            (
                dev.variant,
                has_lut,
                has_pool,
                aligned,
                int_classes(large_ints),
                verify,
                table_kind,
            ),
            head_addresses,
            (next(buffers.arena.launches), *large_ints),
            lambda: (
                _inputs(buffers, args),
                (
                    *_outputs(buffers),
                    buffers.verify_offsets,
                    buffers.verify_row_hints,
                    buffers.launch_sync,
                    buffers.scan_chunk_sums,
                ),
                {
                    "HAS_LUT": has_lut,
                    "HAS_POOL": has_pool,
                    "BLOCK": block,
                    "CHUNK_ROWS": OFFSETS_BLOCK,
                    "ROW_WINDOW": cfg.row_window,
                    "HINT_STRIDE": ROW_HINT_STRIDE,
                    # The interpreter runs programs one after another: a wait not met at
                    # once never is.
                    "MAX_POLLS": 1 if INTERPRETING else cfg.one_launch_max_polls,
                    "VERIFY": verify,
                    "TABLE": table_kind,
                },
                {"num_warps": warps, **dev.entries_options},
            ),
        )
        return

    _three_launches(
        buffers, owner, dev, args, head_addresses, aligned, has_lut, has_pool, table_kind, ints
    )


def _three_launches(
    buffers: PlanBuffers,
    owner: PlanBuffers | None,
    dev: DeviceConfig,
    args: PlanArgs,
    head_addresses: tuple[int, ...] | None,
    aligned: bool | tuple[bool, ...],
    has_lut: bool,
    has_pool: bool,
    table_kind: int,
    ints: tuple[int, ...],
) -> None:
    """The large path's three launches (block sums, offsets, entries): a capture, or
    ``LaunchConfig.one_launch_max_rows`` rows and more. ``ints`` are
    :func:`dispatch_plan`'s runtime ints, in its order."""
    device, cfg = buffers.device, dev.launch
    bs, write_capacity, verify_capacity, window = ints[:4]
    verify = args.verify
    sums_cols = buffers.arena.fields[_BLOCK_SUMS].shape[1]
    rows_addresses = None if head_addresses is None else head_addresses[:3]
    n_sum_blocks = cdiv(bs, OFFSETS_BLOCK)
    sums_ints = (bs, window, sums_cols, verify_capacity)
    _SUMS.launch_fixed(
        owner,
        device,
        (n_sum_blocks, 1, 1),
        (dev.variant, aligned, int_classes(sums_ints), verify),
        rows_addresses,
        sums_ints,
        lambda: (
            _inputs(buffers, args)[:3],
            (buffers.scan_block_sums,),
            {"BLOCK": OFFSETS_BLOCK, "USE_PDL": dev.use_pdl, "VERIFY": verify},
            {"num_warps": cfg.scan_warps},
        ),
    )
    offsets_ints = (bs, n_sum_blocks, sums_cols, write_capacity, verify_capacity, window)
    _OFFSETS.launch_fixed(
        owner,
        device,
        (cdiv(bs + 1, OFFSETS_BLOCK), 1, 1),
        (dev.variant, aligned, int_classes(offsets_ints), verify),
        rows_addresses,
        offsets_ints,
        lambda: (
            _inputs(buffers, args)[:3],
            (
                buffers.scan_block_sums,
                buffers.write_offsets,
                buffers.write_num_valid_reqs,
                buffers.verify_offsets,
                buffers.verify_row_hints,
                buffers.verify_num_valid,
                buffers.verify_enable,
                buffers.status,
            ),
            {
                "BLOCK": OFFSETS_BLOCK,
                "SUM_CHUNK": cfg.sum_chunk,
                "HINT_STRIDE": ROW_HINT_STRIDE,
                "USE_PDL": dev.use_pdl,
                "VERIFY": verify,
            },
            {"num_warps": cfg.scan_warps, **dev.pdl_options},
        ),
    )
    if has_lut:
        block, warps = cfg.lut_entry_block, cfg.lut_entry_warps
    else:
        block, warps = cfg.entry_block, cfg.entry_warps
    seed_programs = cdiv(bs, block)
    # A write-only plan: the seed programs alone.
    entry_grid = min(cdiv(verify_capacity, block), dev.plan_programs) if verify else 0
    entries_ints = (bs, seed_programs, *ints[2:])
    _ENTRIES.launch_fixed(
        owner,
        device,
        (seed_programs + entry_grid, 1, 1),
        (dev.variant, has_lut, has_pool, aligned, int_classes(entries_ints), table_kind),
        head_addresses,
        entries_ints,
        lambda: (
            _inputs(buffers, args),
            (
                buffers.verify_offsets,
                buffers.verify_row_hints,
                buffers.verify_num_valid,
                buffers.verify_enable,
                buffers.write_seed_slot_indices,
                buffers.row_req_pool_indices,
                buffers.verify_slot_indices,
                buffers.verify_expected_tokens,
                buffers.verify_expected_positions,
                buffers.verify_prev_slot_indices,
                buffers.status,
            ),
            {
                "HAS_LUT": has_lut,
                "HAS_POOL": has_pool,
                "BLOCK": block,
                "ROW_WINDOW": cfg.row_window,
                "HINT_STRIDE": ROW_HINT_STRIDE,
                "USE_PDL": dev.use_pdl,
                "TABLE": table_kind,
            },
            {"num_warps": warps, **dev.pdl_options, **dev.entries_options},
        ),
    )


def _inputs(buffers: PlanBuffers, args: PlanArgs) -> tuple[torch.Tensor, ...]:
    """The plan kernels' eight input tensors, the buffers' dummies where an input is not
    given (only a launch not repeated from the cache passes tensors)."""
    lut = args.full_to_swa_index_mapping
    pool = args.req_to_verify_expected_tokens
    valid_lens = args.req_to_verify_expected_tokens_valid_lens
    req_to_token, block_table = args.req_to_token, args.block_table
    return (
        args.req_pool_indices,
        args.prefix_lens,
        args.extend_seq_lens,
        buffers.dummy_int32 if req_to_token is None else req_to_token,
        buffers.dummy_int32 if block_table is None else block_table,
        buffers.dummy_int64 if lut is None else lut,
        buffers.dummy_int32 if pool is None else pool,
        buffers.dummy_int64 if valid_lens is None else valid_lens,
    )


_CHUNK_SUMS = [f.name for f in PLAN_FIELDS].index("scan_chunk_sums")
_BLOCK_SUMS = [f.name for f in PLAN_FIELDS].index("scan_block_sums")
"""Where the scan's sums lie in the layout (their column counts are launch arguments)."""

_outputs = operator.attrgetter(
    "write_offsets",
    "write_seed_slot_indices",
    "write_num_valid_reqs",
    "row_req_pool_indices",
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "verify_enable",
    "status",
)
"""The plan's output fields, in the order the one-launch kernels take them."""

_SMALL = Launcher(plan_small_batch_kernel)
_LARGE = Launcher(plan_large_batch_kernel)
_SUMS = Launcher(scan_block_sums_kernel)
_OFFSETS = Launcher(plan_offsets_kernel)
_ENTRIES = Launcher(plan_entries_kernel)


def int_classes(values: tuple[int, ...]) -> int:
    """A bit per runtime int: set when it does not fit in int32 (Triton then types it
    int64, a different compiled variant)."""
    if INT32_MIN <= min(values) and max(values) <= INT32_MAX:
        return 0  # the common case, in two C calls
    bits = 0
    for i, v in enumerate(values):
        if not INT32_MIN <= v <= INT32_MAX:
            bits |= 1 << i
    return bits
