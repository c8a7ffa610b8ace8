"""The plan stage in torch: its arguments, their host-side checks and the reference.

- :func:`validate_plan_args` (-> :class:`PlanArgs`): every check that needs no tensor data,
  the one module both plan paths run first (``plan_reference`` here, ``launch_plan`` in
  ``kv_canary_kernels``). Everything that can be known without reading tensor data is
  checked before either path writes a byte: the buffers object, each tensor's dtype, rank,
  contiguity and device, ``bs`` against the capacity, the window, the LUT and the token
  pool. Nothing is cast or copied to make an input fit (a cast allocates, and an
  allocation breaks graph replay). Every message starts with ``kv-canary:`` and names the
  argument, what was expected and what was given.
- :func:`plan_reference`: the vectorized torch plan, the CPU path and the kernels' oracle.
  It follows ``docs/contract.md`` line by line, with no Python loop over rows or entries.
  It reads tensor data to size the verify entries and to check the tables, so on a GPU it
  synchronizes: it is an oracle and a CPU path, not something to capture in a CUDA graph.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

import torch
from typing_extensions import Unpack

from .arena import Arena
from .buffers import STAGING_LINK_ATTR, PlanBuffers, StagingLink
from .checks import (
    check_bool,
    check_index,
    check_int64,
    check_positive,
    check_row_tensor,
    check_tensor,
    new_tuple,
)
from .layout import (
    BLOCK_TABLE_DTYPE,
    ENTRY_DTYPE,
    INT64_MAX,
    INT64_MIN,
    LUT_DTYPE,
    MAX_PAGE_SIZE,
    MAX_ROW_WRITES,
    NO_SLOT,
    PLAN_FIELDS,
    REQ_TO_TOKEN_DTYPE,
    ROW_DTYPE,
    TOKEN_POOL_DTYPE,
    UNCHECKED_TOKEN,
)
from .status import PlanStatus


# --- arguments and their checks ---------------------------------------------------------
class _PlanInputsRequired(TypedDict):
    """The required keys of :class:`PlanInputs` (a base class: ``Required[...]`` is not
    read from postponed annotations)."""

    req_pool_indices: torch.Tensor
    """int64 ``[bs]``; ``0`` marks a padding row. ``bs`` must be
    ``<= buffers.write_req_capacity``."""
    prefix_lens: torch.Tensor
    """int64 ``[bs]``, tokens already in the KV cache per row (``P``)."""
    extend_seq_lens: torch.Tensor
    """int64 ``[bs]``, tokens this step writes per row (``E``)."""


class PlanInputs(_PlanInputsRequired, total=False):
    """The plan's keyword arguments, one definition for every plan entry point
    (``plan_reference``, ``kv_canary_kernels.launch_plan``, their ``torch.compile``
    operator): ``**inputs: Unpack[PlanInputs]``. Their defaults are
    :func:`validate_plan_args`'s. Every tensor must be on the buffers' device. Exactly
    one of ``req_to_token`` and ``block_table`` is given (the table)."""

    req_to_token: torch.Tensor | None
    """int32 ``[rows, max_seq_len]``, slot of each (request, position)."""
    block_table: torch.Tensor | None
    """int32 ``[rows, max_blocks]``, a paged table instead of ``req_to_token``: the slot
    of (request ``rp``, position ``pos``) is ``block_table[rp, pos // page_size] *
    page_size + pos % page_size``, or ``-1`` where that block id is negative."""
    page_size: int
    """tokens per block of ``block_table``, in ``[1, 2**31 - 1]`` (default 1; anything
    else only with ``block_table``)."""

    swa_window_size: int
    """``W >= 0`` (default 0): ``0`` is full attention, ``W > 0`` verifies only the last
    ``W`` positions of the prefix and needs the LUT."""
    full_to_swa_index_mapping: torch.Tensor | None
    """optional int64 ``[lut_len]`` translating full-pool slots to sliding-window-pool
    slots (negative slots pass through)."""
    req_to_verify_expected_tokens: torch.Tensor | None
    """optional int32 ``[pool_rows, pool_cols]`` of expected token ids, indexed by
    ``req_pool_indices``."""
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None
    """int64 ``[bs]``, required with the pool; entries at ``pos + offset`` outside
    ``[0, valid_len)`` get token ``-1``."""
    kv_token_id_vs_position_offset: int
    """added to the position before the pool lookup (default 0)."""
    verify: bool
    """``True`` (default): plan the verify entries. ``False``: a write-only plan (the
    write plan only; ``verify_enable = 0``, ``verify_num_valid = 0``): for a step that
    writes but does not verify, which then costs no verify work."""


class PlanArgs(NamedTuple):
    """The validated arguments of one plan call, as both plan paths consume them.

    A NamedTuple rather than an attrs class: it is built at every launch, and a tuple
    is the cheapest immutable record to build."""

    bs: int
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    req_to_token: torch.Tensor | None
    block_table: torch.Tensor | None
    page_size: int
    swa_window_size: int
    full_to_swa_index_mapping: torch.Tensor | None
    req_to_verify_expected_tokens: torch.Tensor | None
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None
    kv_token_id_vs_position_offset: int
    verify: bool
    addresses: tuple[int | None, ...]
    """The data pointers of the eight tensor inputs above, in that order (None for an
    input not given), read once by the checks: the kernels' launch passes them instead
    of the tensors."""

    @property
    def table(self) -> torch.Tensor:
        """The table given: ``req_to_token`` or ``block_table``."""
        table = self.req_to_token if self.block_table is None else self.block_table
        assert table is not None  # validate_plan_args saw to it
        return table

    @property
    def max_seq_len(self) -> int:
        """Positions the table maps (exact: ``max_blocks * page_size`` may pass int64)."""
        return self.table.shape[1] * self.page_size


def check_buffers(buffers: object) -> PlanBuffers:
    """Accept only the library's own :class:`PlanBuffers` (exact type: subclasses and
    objects that only claim the class are refused), re-checked."""
    if type(buffers) is not PlanBuffers:
        raise TypeError(
            "kv-canary: buffers must be a kv_canary_buffers.PlanBuffers "
            f"(build one with PlanBuffers.allocate), got {type(buffers).__name__}"
        )
    buffers.check()
    return buffers


def _refuse_shared_memory(arena: Arena, named: tuple[tuple[str, object], ...]) -> None:
    """The slow path of the aliasing test: name the first input inside the arena."""
    for name, t in named:
        if isinstance(t, torch.Tensor) and arena.overlaps(t):
            raise ValueError(
                f"kv-canary: {name} must not share memory with the PlanBuffers it plans into, "
                "got a tensor inside the buffers' arena (a plan would overwrite its own "
                "input); pass the engine's own tensors"
            )


def _refuse_foreign_staging(buffers: PlanBuffers, named: tuple[tuple[str, object], ...]) -> None:
    """The slow path of the staging test: name the first staging tensor built for other
    buffers."""
    for name, t in named:
        link = getattr(t, STAGING_LINK_ATTR, None)
        if link is None:
            continue
        if type(link) is not StagingLink:
            raise TypeError(
                f"kv-canary: {name} carries a staging link of type {type(link).__name__} "
                "(the tensor was tampered with); build staging with GraphInputs.for_buffers"
            )
        built_for = link.buffers()
        if built_for is not buffers:
            if built_for is None:
                which = "PlanBuffers that no longer exist"
            elif link.generation == buffers.generation:
                which = (
                    f"another PlanBuffers object (also of generation {link.generation}: "
                    "allocated apart; staging serves the buffers it was built for, or use "
                    "GraphInputs.allocate for staging that any buffers accept)"
                )
            else:
                which = f"other PlanBuffers (generation {link.generation})"
            raise ValueError(
                f"kv-canary: {name} is staging built for {which}, passed with PlanBuffers of "
                f"generation {buffers.generation}; after a resize build new staging with "
                "GraphInputs.for_buffers(buffers) (and re-capture the graph)"
            )


def validate_plan_args(
    buffers: object,
    *,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    page_size: int = 1,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None = None,
    kv_token_id_vs_position_offset: int = 0,
    verify: bool = True,
) -> PlanArgs:
    """Run every host-side check of ``docs/contract.md`` and return the arguments.

    Raises ``TypeError`` for an object of the wrong type (``buffers`` not exactly a
    :class:`PlanBuffers`, a tensor argument that is not a tensor, a non-integer scalar)
    and ``ValueError`` for everything else, including an input that shares memory with
    the buffers' arena, staging built for other buffers, and an integer outside int64.
    Reads no tensor data and never syncs.
    """
    if type(buffers) is not PlanBuffers:
        check_buffers(buffers)  # raises the TypeError
    bufs: PlanBuffers = buffers  # type: ignore[assignment]
    bufs.check()
    arena = bufs.arena
    device = arena.device
    on = arena.on_device
    # Hot path (every launch): each check's common case inline (the same tests as the
    # fast paths of check_tensor / check_row_tensor, without their calls); on a miss the
    # named check raises with its message.
    T = torch.Tensor
    rp = req_pool_indices
    if not (
        type(rp) is T and rp.dtype is ROW_DTYPE and rp.dim() == 1 and on(rp) and rp.is_contiguous()
    ):
        check_tensor("req_pool_indices", rp, ROW_DTYPE, 1, device, on)
    bs = rp.shape[0]
    row_shape = (bs,)
    P = prefix_lens
    if not (
        type(P) is T
        and P.dtype is ROW_DTYPE
        and P.shape == row_shape
        and on(P)
        and P.is_contiguous()
    ):
        check_row_tensor("prefix_lens", P, bs, device, on)
    E = extend_seq_lens
    if not (
        type(E) is T
        and E.dtype is ROW_DTYPE
        and E.shape == row_shape
        and on(E)
        and E.is_contiguous()
    ):
        check_row_tensor("extend_seq_lens", E, bs, device, on)
    capacity = arena.fields[_WRITE_ROWS].shape[0]
    if bs > capacity:
        raise ValueError(
            f"kv-canary: bs = len(req_pool_indices) must be <= write_req_capacity, got {bs} > "
            f"{capacity}; grow the buffers with PlanBuffers.resize() or "
            "PlanBuffers.ensure_capacity()"
        )
    table = req_to_token
    if table is not None and block_table is None:  # the common case
        if not (
            type(table) is T
            and table.dtype is REQ_TO_TOKEN_DTYPE
            and table.dim() == 2
            and on(table)
            and table.is_contiguous()
        ):
            check_tensor("req_to_token", table, REQ_TO_TOKEN_DTYPE, 2, device, on)
        if not (type(page_size) is int and page_size == 1):
            _refuse_page_size_with_req_to_token(page_size)
            page_size = 1  # a numpy 1
    else:
        table = _check_block_table(block_table, table is not None, device, on)
        if not (type(page_size) is int and 1 <= page_size <= MAX_PAGE_SIZE):
            page_size = check_positive("page_size", page_size)
            if page_size > MAX_PAGE_SIZE:
                raise ValueError(
                    f"kv-canary: page_size must be in [1, {MAX_PAGE_SIZE}] (block ids are "
                    f"int32: a slot block * page_size + offset must not wrap), got {page_size}"
                )
    window = swa_window_size
    if not (type(window) is int and 0 <= window <= INT64_MAX):
        window = check_int64("swa_window_size", window, minimum=0)
    lut = full_to_swa_index_mapping
    if lut is not None:
        if not (
            type(lut) is T
            and lut.dtype is LUT_DTYPE
            and lut.dim() == 1
            and on(lut)
            and lut.is_contiguous()
        ):
            check_tensor("full_to_swa_index_mapping", lut, LUT_DTYPE, 1, device, on)
    elif window > 0:
        raise ValueError(
            f"kv-canary: full_to_swa_index_mapping must be given when swa_window_size > 0, "
            f"got None with swa_window_size = {window}"
        )
    pool = req_to_verify_expected_tokens
    valid_lens = req_to_verify_expected_tokens_valid_lens
    if pool is not None:
        if not (
            type(pool) is T
            and pool.dtype is TOKEN_POOL_DTYPE
            and pool.dim() == 2
            and on(pool)
            and pool.is_contiguous()
        ):
            check_tensor("req_to_verify_expected_tokens", pool, TOKEN_POOL_DTYPE, 2, device, on)
        if valid_lens is None:
            raise ValueError(
                "kv-canary: req_to_verify_expected_tokens_valid_lens must be given with "
                "req_to_verify_expected_tokens, got None"
            )
        if not (
            type(valid_lens) is T
            and valid_lens.dtype is ROW_DTYPE
            and valid_lens.shape == row_shape
            and on(valid_lens)
            and valid_lens.is_contiguous()
        ):
            check_row_tensor("req_to_verify_expected_tokens_valid_lens", valid_lens, bs, device, on)
    elif valid_lens is not None:
        raise ValueError(
            "kv-canary: req_to_verify_expected_tokens_valid_lens must be None when "
            "req_to_verify_expected_tokens is None, got a tensor"
        )
    offset = kv_token_id_vs_position_offset
    if not (type(offset) is int and INT64_MIN <= offset <= INT64_MAX):
        offset = check_int64("kv_token_id_vs_position_offset", offset)
    verify = verify if type(verify) is bool else check_bool("verify", verify)

    # No input may share memory with the arena (the plan would overwrite what it still
    # reads): one range test per input (all are contiguous), named on the slow path.
    # Staging tensors carry the PlanBuffers they were built for: refuse other buffers.
    # The row tensors were just checked int64 [bs] and contiguous: 8 * bs bytes each.
    start = arena.base
    end = start + arena.nbytes
    row_bytes = 8 * bs
    paged = block_table is not None
    inputs = (rp, P, E, req_to_token, block_table, lut, pool, valid_lens)
    addresses = (
        rp.data_ptr(),
        P.data_ptr(),
        E.data_ptr(),
        None if paged else table.data_ptr(),
        table.data_ptr() if paged else None,
        None if lut is None else lut.data_ptr(),
        None if pool is None else pool.data_ptr(),
        None if valid_lens is None else valid_lens.data_ptr(),
    )
    linked = False
    for i in (0, 1, 2, 7):
        ptr = addresses[i]
        if ptr is not None:
            if ptr < end and ptr + row_bytes > start:
                _refuse_shared_memory(arena, _named_inputs(*inputs))
            if getattr(inputs[i], STAGING_LINK_ATTR, None) is not None:  # linked staging
                linked = True
    for i in (3, 4, 5, 6):
        ptr = addresses[i]
        if ptr is not None and ptr < end and ptr + inputs[i].nbytes > start:  # type: ignore[union-attr]
            _refuse_shared_memory(arena, _named_inputs(*inputs))
    if linked:  # after every aliasing test
        _refuse_foreign_staging(bufs, _named_inputs(*inputs))
    return new_tuple(
        PlanArgs,
        (
            bs,
            rp,
            P,
            E,
            req_to_token,
            block_table,
            page_size,
            window,
            lut,
            pool,
            valid_lens,
            offset,
            verify,
            addresses,
        ),
    )


def _check_block_table(
    block_table: object, with_req_to_token: bool, device: torch.device, on: Any
) -> torch.Tensor:
    """The paged table (the slow path of the table's checks): exactly one table given."""
    if block_table is None and not with_req_to_token:
        raise ValueError(
            "kv-canary: req_to_token or block_table must be given (the table the plan "
            "reads slots from), got neither"
        )
    if block_table is not None and with_req_to_token:
        raise ValueError(
            "kv-canary: exactly one of req_to_token and block_table must be given, got both "
            "(pass block_table with page_size for a paged table, req_to_token otherwise)"
        )
    return check_tensor("block_table", block_table, BLOCK_TABLE_DTYPE, 2, device, on)


def _refuse_page_size_with_req_to_token(page_size: object) -> None:
    number = check_index("page_size", page_size)
    if number != 1:
        raise ValueError(
            f"kv-canary: page_size must be 1 (its default) with req_to_token, got {number}; "
            "page_size is the block size of block_table: pass block_table instead of "
            "req_to_token for a paged table"
        )


def _named_inputs(*tensors: object) -> tuple[tuple[str, object], ...]:
    return tuple(zip(_INPUT_NAMES, tensors))


_WRITE_ROWS = [f.name for f in PLAN_FIELDS].index("write_seed_slot_indices")
"""The arena field whose length is ``write_req_capacity``."""

_INPUT_NAMES = (
    "req_pool_indices",
    "prefix_lens",
    "extend_seq_lens",
    "req_to_token",
    "block_table",
    "full_to_swa_index_mapping",
    "req_to_verify_expected_tokens",
    "req_to_verify_expected_tokens_valid_lens",
)


# --- the torch reference ------------------------------------------------------------------
def _raise_first_bad(bad: torch.Tensor, argument: str, values: torch.Tensor, rule: str) -> None:
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"kv-canary: {argument}[{row}] = {int(values[row])} must be {rule} "
            f"for active row {row} (data outside the tables)"
        )


def _raise_first_negative(negative: torch.Tensor, P: torch.Tensor, E: torch.Tensor) -> None:
    """The first busy row of negative length (``NEGATIVE_LENGTH`` on the kernels), its
    ``prefix_lens`` named before its ``extend_seq_lens``."""
    if bool(negative.any()):
        row = int(negative.nonzero()[0, 0])
        name, value = ("prefix_lens", P) if int(P[row]) < 0 else ("extend_seq_lens", E)
        raise ValueError(
            f"kv-canary: {name}[{row}] = {int(value[row])} must be >= 0 for busy row {row} "
            "(a negative length: the kernels plan the row as padding and set "
            "PlanStatus.NEGATIVE_LENGTH)"
        )


def _gather(
    table: torch.Tensor, flat_index: torch.Tensor, mask: torch.Tensor | None, fill: int
) -> torch.Tensor:
    """``table.flatten()[flat_index]`` as int64 where ``mask`` (everywhere if None),
    ``fill`` elsewhere. Flat ``torch.take`` is much faster on the CPU than 2-D advanced
    indexing or boolean-mask indexing, and an unmasked lane's index is never read."""
    if mask is None:
        return torch.take(table, flat_index).to(ENTRY_DTYPE)
    if table.numel() == 0:  # then no lane can be in mask: the callers checked the data
        return torch.full_like(flat_index, fill)
    values = torch.take(table, torch.where(mask, flat_index, 0)).to(ENTRY_DTYPE)
    return torch.where(mask, values, fill)


def _read_table(
    args: PlanArgs, rows: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, fill: int
) -> torch.Tensor:
    """``table(rows, pos)`` of the contract ("The table") as int64 where ``mask`` (everywhere
    if None), ``fill`` elsewhere: a ``req_to_token`` read, or a ``block_table`` read whose
    block id becomes ``b * page_size + pos % page_size`` (``-1`` for a negative id). The
    callers checked that every lane in ``mask`` lies inside the table."""
    table = args.table
    width = table.shape[1]
    if args.block_table is None:
        return _gather(table, rows * width + pos, mask, fill)
    page = args.page_size
    block = torch.div(pos, page, rounding_mode="floor")  # a masked-out lane's pos may be < 0
    ids = _gather(table, rows * width + block, mask, fill)
    # No wrap: ids < 2**31 and page < 2**31 (a masked-out lane holds fill, -1 or 0).
    slots = torch.where(ids >= 0, ids * page + (pos - block * page), NO_SLOT)
    return slots if mask is None else torch.where(mask, slots, fill)


def _translate(
    slots: torch.Tensor,
    lut: torch.Tensor | None,
    rows: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """``xlat`` of the contract: look up non-negative slots in the LUT, pass others."""
    if lut is None:
        return slots
    looked_up = slots >= 0
    bad = looked_up & (slots >= lut.shape[0])
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"kv-canary: slot {int(slots[i])} read by row {int(rows[i])} at position "
            f"{int(positions[i])} must be < len(full_to_swa_index_mapping) = {lut.shape[0]}, "
            "got a slot at or past it (data outside the tables)"
        )
    if lut.numel() == 0:  # nothing can be looked up: every slot is negative (checked above)
        return slots
    return torch.where(looked_up, torch.take(lut, slots.clamp_min(0)), slots)


def _plan(args: PlanArgs, verify_capacity: int) -> dict[str, Any]:
    """Compute every output; raise on data outside the tables; write nothing."""
    rp, P, E = args.req_pool_indices, args.prefix_lens, args.extend_seq_lens
    lut = args.full_to_swa_index_mapping
    pool = args.req_to_verify_expected_tokens
    valid_lens = args.req_to_verify_expected_tokens_valid_lens
    window = args.swa_window_size
    device = rp.device
    bs = args.bs
    rows = args.table.shape[0]
    # Exact, and clamped to int64 for the comparison (no prefix lies past INT64_MAX).
    max_seq_len = min(args.max_seq_len, INT64_MAX)
    table_name = "req_to_token" if args.block_table is None else "block_table"
    width_name = (
        "req_to_token.shape[1]" if args.block_table is None else "block_table.shape[1] * page_size"
    )

    busy = rp != 0
    negative = busy & ((P < 0) | (E < 0))  # planned as padding (NEGATIVE_LENGTH)
    _raise_first_negative(negative, P, E)
    active = busy & ~negative
    # Wrap-free for any int64 P, E and W (docs/contract.md, "Extreme values"): a row's
    # count is min(P, W) (P without a window, 0 for P <= 0) with no subtraction; its
    # window start P - count lies in [0, P]. The counts are summed clamped to
    # verify_capacity + 1 (enough to decide overflow; exact when it does not happen), and
    # a write count is clamped to MAX_ROW_WRITES, so no prefix sum can wrap.
    count = P.clamp_max(window) if window > 0 else P
    count = torch.where(P > 0, count, 0)
    window_start = torch.where(P > 0, P - count, 0)
    vcount = torch.where(active, count, 0).clamp_max(verify_capacity + 1)
    wcount = torch.where(active, E.clamp_max(MAX_ROW_WRITES), 0)

    _raise_first_bad(
        active & ((rp < 0) | (rp >= rows)),
        "req_pool_indices",
        rp,
        f"in [0, {rows}) = [0, {table_name}.shape[0])",
    )
    _raise_first_bad(
        active & (P > max_seq_len),
        "prefix_lens",
        P,
        f"<= {width_name} = {args.max_seq_len}",
    )
    if pool is not None:
        assert valid_lens is not None
        pool_rows, pool_cols = pool.shape
        _raise_first_bad(
            active & ((rp < 0) | (rp >= pool_rows)),
            "req_pool_indices",
            rp,
            f"in [0, {pool_rows}) = [0, req_to_verify_expected_tokens.shape[0])",
        )
        _raise_first_bad(
            active & (valid_lens > pool_cols),
            "req_to_verify_expected_tokens_valid_lens",
            valid_lens,
            f"<= req_to_verify_expected_tokens.shape[1] = {pool_cols}",
        )

    write_offsets = torch.zeros(bs + 1, dtype=ENTRY_DTYPE, device=device)
    torch.cumsum(wcount, 0, out=write_offsets[1:])

    rows_idx = torch.arange(bs, device=device)
    wants_seed = active & (P > 0) & (wcount > 0)
    seed_pos = P.clamp_min(1) - 1  # P - 1 where a seed is read; no wrap at P = -2**63
    # Padding rows may hold any rp: their (unread) flat indices use row 0, so even the
    # discarded index arithmetic cannot wrap.
    rp_read = torch.where(active, rp, 0)
    raw_seeds = _read_table(args, rp_read, seed_pos, wants_seed, NO_SLOT)
    seeds = torch.where(wants_seed, _translate(raw_seeds, lut, rows_idx, seed_pos), NO_SLOT)

    if not args.verify:  # a write-only plan: no verify entry, nothing of them read
        return {"write_offsets": write_offsets, "seeds": seeds, "verify": False}
    verify_offsets = torch.zeros(bs + 1, dtype=ENTRY_DTYPE, device=device)
    torch.cumsum(vcount, 0, out=verify_offsets[1:])
    total = int(verify_offsets[-1])
    out = {
        "verify": True,
        "write_offsets": write_offsets,
        "seeds": seeds,
        "total": total,
        "verify_offsets": verify_offsets,
        "entries": None,
    }
    if total > verify_capacity:
        return out  # overflow: no entry is written, and no entry's table is read

    row = torch.repeat_interleave(rows_idx, vcount, output_size=total)
    starts = verify_offsets[:-1]
    pos = (window_start - starts).index_select(0, row) + torch.arange(total, device=device)
    req = rp.index_select(0, row)
    slots = _translate(_read_table(args, req, pos, None, 0), lut, row, pos)
    # prev of an entry is the slot of the entry before it in the same row; a row's first
    # entry reads its own predecessor (the real one at a window start, none at position 0).
    prev = torch.empty_like(slots)
    prev[1:] = slots[:-1]
    has_entries = vcount > 0
    head_pos = window_start - 1
    head_raw = _read_table(args, rp_read, head_pos, has_entries & (head_pos >= 0), NO_SLOT)
    head = _translate(head_raw, lut, rows_idx, head_pos)
    prev[starts[has_entries]] = head[has_entries]
    if pool is None:
        tokens = torch.full((total,), UNCHECKED_TOKEN, dtype=ENTRY_DTYPE, device=device)
    else:
        assert valid_lens is not None
        # q = pos + offset, saturated at INT64_MAX (pos >= 0): no wrap, and a saturated q
        # fails q < valid_len exactly when the true sum would.
        offset = args.kv_token_id_vs_position_offset
        q = pos.clamp_max(INT64_MAX - max(offset, 0)) + offset
        checked = (q >= 0) & (q < valid_lens.index_select(0, row))
        tokens = _gather(pool, req * pool.shape[1] + q, checked, UNCHECKED_TOKEN)
    out["entries"] = (slots, tokens, pos, prev)
    return out


def plan_reference(buffers: PlanBuffers, **inputs: Unpack[PlanInputs]) -> None:
    """Fill ``buffers`` with the plan of one batch, exactly per ``docs/contract.md``.

    Args:
        buffers: the :class:`PlanBuffers` to fill.
        **inputs: the batch, :class:`PlanInputs` (``req_pool_indices``, ``prefix_lens``,
            ``extend_seq_lens``, ``req_to_token``, and the optional window, LUT and
            expected-token pool).

    Raises:
        TypeError: ``buffers`` is not a :class:`PlanBuffers`, or an argument has the
            wrong type.
        ValueError: a host-side check failed, an active row's data lies outside the
            tables, or a busy row has a negative length (the message names the row and
            the value). Nothing is written then.

    A plan whose verify entries exceed ``verify_capacity`` is not an error: as on the
    kernels, no entry is written and ``PlanStatus.VERIFY_OVERFLOW`` is OR-ed into
    ``buffers.status``.
    """
    args = validate_plan_args(buffers, **inputs)
    buffers.check(views=True)  # torch writes through the views themselves
    plan = _plan(args, buffers.verify_capacity)

    bs = args.bs
    buffers.write_offsets[: bs + 1].copy_(plan["write_offsets"])
    buffers.write_offsets[bs + 1 :].zero_()
    buffers.write_seed_slot_indices[:bs].copy_(plan["seeds"])
    buffers.write_num_valid_reqs.fill_(bs)
    buffers.row_req_pool_indices[:bs].copy_(args.req_pool_indices)
    if not plan["verify"]:
        buffers.verify_num_valid.zero_()
        buffers.verify_enable.zero_()
        return
    total = plan["total"]
    if plan["entries"] is None:
        buffers.verify_num_valid.fill_(buffers.verify_capacity)
        buffers.verify_enable.fill_(0)
        # Not an error, but a step that verifies nothing: flagged as the kernels flag it.
        buffers.status.bitwise_or_(int(PlanStatus.VERIFY_OVERFLOW))
        return
    slots, tokens, positions, prev = plan["entries"]
    buffers.verify_slot_indices[:total].copy_(slots)
    buffers.verify_expected_tokens[:total].copy_(tokens)
    buffers.verify_expected_positions[:total].copy_(positions)
    buffers.verify_prev_slot_indices[:total].copy_(prev)
    buffers.verify_offsets[: bs + 1].copy_(plan["verify_offsets"])
    buffers.verify_num_valid.fill_(total)
    buffers.verify_enable.fill_(1)
