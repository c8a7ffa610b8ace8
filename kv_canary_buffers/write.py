"""The write stage in torch: its arguments, their host-side checks and the reference.

- :func:`validate_write_args` (-> :class:`WriteArgs`): every host-side check of one write
  call, run first by both write paths (``write_reference`` here, ``launch_write`` in
  ``kv_canary_kernels``); reads no tensor data and never syncs.
- :func:`write_reference`: the torch write stage, the CPU path and the write kernel's
  oracle. It follows docs/contract-canary.md ("Write") line by line. The chain within a row
  is serial by definition, so the loop runs over token positions within rows, each step
  vectorized across every row that still has tokens. It reads tensor data (to size the
  loop and to check it), so on a GPU it synchronizes: an oracle and a CPU path, not
  something to capture.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NoReturn, TypedDict

import torch
from typing_extensions import Unpack

from .buffers import PlanBuffers
from .checks import check_int64, check_length, check_tensor, new_tuple
from .hashing import mix3
from .layout import (
    DUMMY_SLOT,
    ENTRY_SLOT,
    INT64_MAX,
    INT64_MIN,
    MAX_CAPACITY,
    POSITION,
    RECORD_DTYPE,
    ROW_DTYPE,
    VIOLATION_WIDTH,
)
from .real_kv import RealKV, first_row_past_sources, real_kv_hash
from .records import (
    append_rows,
    chain_hash_of,
    check_not_aliasing_store,
    check_plan_buffers,
    check_real_kv,
    check_same_device,
    check_store,
    plan_count,
    raise_bad,
)
from .status import CanaryStatus, FailBits
from .store import CanaryStore
from .workspace import ChainFill, WriteWorkspace


# --- arguments and their checks ---------------------------------------------------------
class _WriteInputsRequired(TypedDict):
    """The required keys of :class:`WriteInputs` (see :class:`PlanInputs`)."""

    input_ids: torch.Tensor
    """int64 ``[n]``, the token of each written KV slot, flat in the order of the plan's
    ``write_offsets``."""
    positions: torch.Tensor
    """int64 ``[n]``, each token's position."""
    out_cache_loc: torch.Tensor
    """int64 ``[n]``, each token's KV slot; negative: skip."""


class WriteChainInputs(_WriteInputsRequired, total=False):
    """The split write's chain keywords (``write_chain_reference``,
    ``kv_canary_kernels.launch_write_chain``, their ``torch.compile`` operator): the
    write's (:class:`WriteInputs`) but ``real_kv``, which only the stamp reads. Their
    defaults are :func:`validate_write_chain_args`'s."""

    launch_tag: int
    """int64 written into every violation row of this call (default 0)."""
    expected_input_ids: torch.Tensor | None
    """optional int64 ``[n]``; with ``expected_positions``, a token or position differing
    from them appends a ``WRITE_TOKEN`` / ``WRITE_POSITION`` row."""
    expected_positions: torch.Tensor | None
    """optional int64 ``[n]``, given with ``expected_input_ids``."""


class WriteInputs(WriteChainInputs, total=False):
    """The write's keyword arguments, one definition for every write entry point
    (``write_reference``, ``kv_canary_kernels.launch_write``, their ``torch.compile``
    operator): ``**inputs: Unpack[WriteInputs]``. Their defaults are
    :func:`validate_write_args`'s. Every tensor must be on the store's device."""

    real_kv: RealKV | None
    """optional :class:`RealKV` whose bytes are hashed into each record."""


class WriteStampInputs(TypedDict, total=False):
    """The split write's stamp keywords (``write_stamp_reference``,
    ``kv_canary_kernels.launch_write_stamp``, their ``torch.compile`` operator); defaults:
    :func:`validate_write_stamp_args`'s."""

    real_kv: RealKV | None
    """optional :class:`RealKV` whose bytes (written by the forward) are hashed into each
    record, as :class:`WriteInputs`' ``real_kv``."""


class WriteArgs(NamedTuple):
    """The validated arguments of one write call."""

    n: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    launch_tag: int
    expected_input_ids: torch.Tensor | None
    expected_positions: torch.Tensor | None
    real_kv: RealKV | None
    """None when no real-KV hash is taken (no object, mode NONE or no sources)."""
    aligned: bool
    """Whether every per-token input starts 16-byte aligned (the kernels' fast variant)."""
    addresses: tuple[int, ...]
    """The data pointers of input_ids, positions, out_cache_loc, then of the expected
    inputs or (without them) of input_ids and positions again, read once by the checks:
    the kernel's launch passes them instead of the tensors."""


def validate_write_args(
    store: object,
    plan_buffers: object,
    *,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    launch_tag: int = 0,
    expected_input_ids: torch.Tensor | None = None,
    expected_positions: torch.Tensor | None = None,
    real_kv: RealKV | None = None,
) -> WriteArgs:
    """Every host-side check of one write call (both write paths run it first).

    ``TypeError`` for an object of the wrong type, ``ValueError`` for everything else;
    reads no tensor data and never syncs."""
    # check_store / check_plan_buffers / check_same_device, their common case inline
    if type(store) is not CanaryStore:
        check_store(store)  # raises the TypeError
    st: CanaryStore = store  # type: ignore[assignment]
    st.check()
    if type(plan_buffers) is not PlanBuffers:
        check_plan_buffers(plan_buffers)  # raises the TypeError
    bufs: PlanBuffers = plan_buffers  # type: ignore[assignment]
    bufs.check()
    if st.arena.device != bufs.arena.device:
        check_same_device(st, bufs)
    has_expected = expected_input_ids is not None
    if has_expected != (expected_positions is not None):
        given = "expected_input_ids" if expected_positions is None else "expected_positions"
        raise ValueError(
            "kv-canary: expected_input_ids and expected_positions must be given together, "
            f"got only {given}"
        )
    inputs = (
        (input_ids, positions, out_cache_loc, expected_input_ids, expected_positions)
        if has_expected
        else (input_ids, positions, out_cache_loc)
    )
    # Hot path (every launch): a handful of attribute reads per input; the detailed
    # checks below run only to word the error.
    arena = st.arena
    start, end = arena.base, arena.base + arena.nbytes
    # get_device() alone is -1 on the CPU and on meta: compare the device type too
    on_device = arena.on_device
    n = out_cache_loc.shape[0] if isinstance(out_cache_loc, torch.Tensor) else -1
    shape = (n,)
    aligned = True
    pointers = []
    for t in inputs:
        if not (
            isinstance(t, torch.Tensor)
            and t.dtype is ROW_DTYPE
            and t.shape == shape
            and on_device(t)
            and t.is_contiguous()
        ):
            _raise_write_input_error(st, inputs)
        ptr = t.data_ptr()
        if ptr < end and start < ptr + 8 * n:
            _raise_write_input_error(st, inputs)
        aligned = aligned and ptr % 16 == 0
        pointers.append(ptr)
    if not has_expected:
        pointers += pointers[:2]
    tag = (
        launch_tag
        if type(launch_tag) is int and INT64_MIN <= launch_tag <= INT64_MAX
        else (check_int64("launch_tag", launch_tag))
    )
    kv = None if real_kv is None else check_real_kv(real_kv, st)
    return new_tuple(
        WriteArgs,
        (
            n,
            input_ids,
            positions,
            out_cache_loc,
            tag,
            expected_input_ids,
            expected_positions,
            kv,
            aligned,
            tuple(pointers),
        ),
    )


_WRITE_INPUT_NAMES = (
    "input_ids",
    "positions",
    "out_cache_loc",
    "expected_input_ids",
    "expected_positions",
)


def _raise_write_input_error(store: CanaryStore, inputs: tuple[Any, ...]) -> NoReturn:
    """Word the first failing check of the write's per-token inputs."""
    device = store.device
    check_tensor("out_cache_loc", inputs[2], ROW_DTYPE, 1, device)
    n = inputs[2].shape[0]
    for name, t in zip(_WRITE_INPUT_NAMES, inputs):
        check_length(name, t, n, device)
    for name, t in zip(_WRITE_INPUT_NAMES, inputs):
        check_not_aliasing_store(name, t, store)
    raise AssertionError("kv-canary: internal error: the fast input check failed alone")


# --- the torch reference ------------------------------------------------------------------
def _rows(*columns: torch.Tensor) -> torch.Tensor:
    return torch.stack([c.to(RECORD_DTYPE) for c in columns], dim=1)


class _Chain(NamedTuple):
    """What the write computes before it needs the KV bytes: per token of the rows (flat
    order ``k``) its input index, slot, whether it is stamped, token, position, chain hash
    before it and row's request; and the violation rows with their context."""

    indices: torch.Tensor
    slots: torch.Tensor
    written: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    chain_at: torch.Tensor
    requests: torch.Tensor
    rows: torch.Tensor
    """int64 ``[m, 8 + 3]``: each violation row and its context, in the contract's order."""


def _chain(store: CanaryStore, buffers: PlanBuffers, args: WriteArgs) -> _Chain:
    """The write's checks of data out of range (``ValueError``, nothing written), its hash
    chains and its violation rows: everything but the records, computed without writing."""
    num_slots = store.num_slots
    n = args.n
    num_rows = plan_count(buffers, "write_num_valid_reqs", buffers.write_req_capacity)
    offsets = buffers.write_offsets[: num_rows + 1]
    lo, hi = offsets[:-1], offsets[1:]
    seeds = buffers.write_seed_slot_indices[:num_rows]
    busy = hi > lo
    bad = busy & ((lo < 0) | (hi > n))
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"kv-canary: plan_buffers.write_offsets[{r}:{r + 2}] = [{int(lo[r])}, {int(hi[r])}] "
            f"must lie in [0, n = len(out_cache_loc) = {n}] (data outside the inputs: the "
            "kernels skip it and raise a CanaryStatus bit)"
        )
    bad = busy & (seeds >= num_slots)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise_bad("plan_buffers.write_seed_slot_indices", r, int(seeds[r]), f"< {num_slots}")

    seeds = torch.where(busy, seeds, -1)  # an idle row's seed is never read
    lengths = torch.where(busy, hi - lo, 0)
    total = int(lengths.sum())
    row_of = torch.repeat_interleave(torch.arange(num_rows, device=lo.device), lengths)
    # each token's row's request: the owner it stamps, the context of its rows
    requests = buffers.row_req_pool_indices[:num_rows].index_select(0, row_of)
    first = torch.cumsum(lengths, 0) - lengths
    index = (
        lo.index_select(0, row_of)
        + torch.arange(total, device=lo.device)
        - first.index_select(0, row_of)
    )
    slots = args.out_cache_loc.index_select(0, index)
    bad = slots >= num_slots
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        raise_bad("out_cache_loc", int(index[j]), int(slots[j]), f"< num_slots = {num_slots}")
    written = slots >= 0

    records = store.records
    running = chain_hash_of(records, seeds)
    check_pos = (store.chain_position_check != 0) & (seeds >= 0)
    prev_pos = torch.where(check_pos, records.index_select(0, seeds.clamp_min(0))[:, POSITION], 0)

    tokens = args.input_ids.index_select(0, index)
    positions = args.positions.index_select(0, index)
    exp_tok: torch.Tensor | None
    exp_pos: torch.Tensor | None
    bits: torch.Tensor | None
    tag = torch.full((total,), args.launch_tag, dtype=RECORD_DTYPE, device=lo.device)
    if args.expected_input_ids is not None:
        assert args.expected_positions is not None
        exp_tok = args.expected_input_ids.index_select(0, index)
        exp_pos = args.expected_positions.index_select(0, index)
        bits = torch.where(tokens != exp_tok, int(FailBits.WRITE_TOKEN), 0) | torch.where(
            positions != exp_pos, int(FailBits.WRITE_POSITION), 0
        )
    else:
        exp_tok = exp_pos = bits = None
    chain_at = torch.empty(total, dtype=RECORD_DTYPE, device=lo.device)
    pos_rule = torch.zeros(total, dtype=torch.bool, device=lo.device)
    expected_next = torch.zeros(total, dtype=RECORD_DTYPE, device=lo.device)
    max_len = int(lengths.max()) if num_rows else 0
    for step in range(max_len):
        rows = (lengths > step).nonzero().squeeze(1)
        k = first.index_select(0, rows) + step  # flat token numbers of this step
        w = written.index_select(0, k)
        run = running.index_select(0, rows)
        chain_at[k] = run
        tok = tokens.index_select(0, k)
        pos = positions.index_select(0, k)
        checking = w & check_pos.index_select(0, rows)
        want = prev_pos.index_select(0, rows) + 1
        pos_rule[k] = checking & (pos != want)
        expected_next[k] = want
        prev_pos[rows] = torch.where(checking, pos, prev_pos.index_select(0, rows))
        running[rows] = torch.where(w, mix3(run, tok, pos), run)

    # Each row with its context (the writing row's request, the expected position, the
    # writing row as the owner) as the last three columns, split off after ordering.
    parts = []
    if bits is not None:
        assert exp_tok is not None and exp_pos is not None
        hit = written & (bits != 0)
        row = (tag, slots, positions, tokens, exp_tok, chain_at, exp_pos, bits)
        parts.append((hit, _rows(*row, requests, exp_pos, requests), 0))
    pos_bits = torch.full_like(tag, int(FailBits.WRITE_POSITION))
    row = (tag, slots, positions, tokens, tokens, chain_at, expected_next, pos_bits)
    parts.append((pos_rule, _rows(*row, requests, expected_next, requests), 1))
    ordered = _in_flat_order(parts)
    return _Chain(index, slots, written, tokens, positions, chain_at, requests, ordered)


def _append(store: CanaryStore, rows: torch.Tensor) -> None:
    append_rows(store, rows[:, :VIOLATION_WIDTH], rows[:, VIOLATION_WIDTH:])


def _stamp(
    store: CanaryStore,
    slots: torch.Tensor,
    columns: tuple[torch.Tensor, ...],
    kv: torch.Tensor,
    written: int | None = None,
) -> None:
    """Store each record ``(token, position, prev_hash, kv)`` and its owner (``columns``:
    token, position, prev_hash, owner, one row per slot of ``slots``, in order), raise the
    padding bit, count the records (``written``: the records stored, a slot written twice
    counted twice; ``slots.numel()`` when None)."""
    tokens, positions, chain_at, owners = columns
    # Sequential order: a slot written twice keeps its last record (index_put_ with
    # accumulate=False applies duplicates in order on the CPU and is unspecified on a GPU,
    # so a duplicate slot is written in a second, ordered pass).
    # The owner beside the record, under the same condition (its own column: SGLang's
    # record stays 32 bytes).
    new = _rows(tokens, positions, chain_at, kv, owners)
    _store_in_order((store.records, store.owners), slots, new)
    if bool((slots == DUMMY_SLOT).any()):  # the padding slot: stamped all the same
        store.status.bitwise_or_(int(CanaryStatus.PADDING_SLOT_WRITTEN))
    store.kernel_runs.add_(1)
    store.slots_processed.add_(slots.numel() if written is None else written)


def _write(store: CanaryStore, buffers: PlanBuffers, args: WriteArgs) -> None:
    _commit(store, *_checked(store, buffers, args))


def _checked(
    store: CanaryStore, buffers: PlanBuffers, args: WriteArgs
) -> tuple[_Chain, torch.Tensor]:
    """The write's chain and real-KV hashes, every data check passed (``ValueError``
    otherwise), nothing written yet."""
    chain = _chain(store, buffers, args)
    return chain, _real_kv_of(args.real_kv, chain.slots, chain.written, chain.indices)


def _commit(store: CanaryStore, chain: _Chain, kv: torch.Tensor) -> None:
    """Write what :func:`_checked` computed into ``store``."""
    kept = chain.written.nonzero().squeeze(1)
    columns = (chain.tokens, chain.positions, chain.chain_at, chain.requests)
    _stamp(
        store,
        chain.slots.index_select(0, kept),
        tuple(c.index_select(0, kept) for c in columns),
        kv.index_select(0, kept),
    )
    _append(store, chain.rows)


def _real_kv_of(
    real_kv: RealKV | None, slots: torch.Tensor, written: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    kv = torch.zeros_like(slots)
    if real_kv is None:
        return kv
    looked = written.nonzero().squeeze(1)
    s = slots.index_select(0, looked)
    k = first_row_past_sources(real_kv, s)
    if k is not None:
        raise_bad(
            "out_cache_loc",
            int(index[looked[k]]),
            int(s[k]),
            "a slot whose real-KV page row lies inside every source",
        )
    kv[looked] = real_kv_hash(real_kv, s)
    return kv


def _store_in_order(
    targets: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, rows: torch.Tensor
) -> None:
    """``records[slots[i]] = rows[i, :4]`` and ``owners[slots[i]] = rows[i, 4]`` in order
    of ``i`` (the last write of a slot wins), ``targets = (records, owners)``."""
    if slots.numel() == 0:
        return
    records, owners = targets
    order = torch.arange(slots.numel(), device=slots.device)
    last = torch.full((records.shape[0],), -1, dtype=torch.int64, device=slots.device)
    last.scatter_reduce_(0, slots, order, reduce="amax")
    final = last.index_select(0, slots) == order
    records.index_copy_(0, slots[final], rows[final, : records.shape[1]])
    owners.index_copy_(0, slots[final], rows[final, records.shape[1]])


def _in_flat_order(parts: list[tuple[torch.Tensor, torch.Tensor, int]]) -> torch.Tensor:
    """The violation rows of ``parts`` (mask, rows, rank) in the contract's sequential
    order: by flat token number, then rank within a token (input check before position)."""
    keys, rows = [], []
    for mask, part_rows, rank in parts:
        idx = mask.nonzero().squeeze(1)
        keys.append(idx * 2 + rank)
        rows.append(part_rows.index_select(0, idx))
    order = torch.argsort(torch.cat(keys))
    return torch.cat(rows).index_select(0, order)


def write_reference(
    store: CanaryStore, plan_buffers: PlanBuffers, **inputs: Unpack[WriteInputs]
) -> None:
    """Stamp the records of the slots a step wrote, exactly per docs/contract-canary.md
    ("Write").

    Args:
        store: the :class:`CanaryStore` of the KV pool.
        plan_buffers: a :class:`PlanBuffers` filled by the step's plan (its
            ``write_offsets``, ``write_seed_slot_indices``, ``write_num_valid_reqs`` and
            ``row_req_pool_indices``: each stamped slot's owner).
        **inputs: the step's tokens, :class:`WriteInputs` (``input_ids``, ``positions``,
            ``out_cache_loc``, and the optional tag, expected inputs and ``real_kv``).

    Raises:
        TypeError: ``store`` is not a :class:`CanaryStore`, ``plan_buffers`` not a
            :class:`PlanBuffers`, or an argument has the wrong type.
        ValueError: a host-side check failed, or the data lies outside the store or the
            inputs (the message names the argument, the index and the value). Nothing is
            written then. A token written at the padding slot 0 is not refused: it is
            stamped, and ``CanaryStatus.PADDING_SLOT_WRITTEN`` is set in ``store.status``
            (as the kernels do).
    """
    args = validate_write_args(store, plan_buffers, **inputs)
    store.check(views=True)  # torch reads and writes through the views themselves
    plan_buffers.check(views=True)
    _write(store, plan_buffers, args)


# --- two stores' writes of one step: HEAD (with the expected inputs) and TAIL ------------------
class WritePairArgs(NamedTuple):
    """The validated arguments of one pair write: each store's :class:`WriteArgs`."""

    head: WriteArgs
    tail: WriteArgs


def validate_write_pair_args(
    head: object,
    tail: object,
    plan_buffers: object,
    *,
    tail_launch_tag: int = 0,
    **inputs: Unpack[WriteInputs],
) -> WritePairArgs:
    """Every host-side check of a pair write: :func:`validate_write_args` of ``head`` with
    ``inputs`` and of ``tail`` with the same per-token inputs and ``real_kv``, its own tag
    and no expected inputs; ``tail`` another store than ``head``; and the expected inputs
    outside ``tail``'s arena too (the head's programs read them while the tail's write
    there). ``TypeError`` / ``ValueError`` as :func:`validate_write_args`; reads no data."""
    h = _for_store("head", validate_write_args, head, plan_buffers, **inputs)
    check_two_stores(head, tail)
    tag = (
        tail_launch_tag
        if type(tail_launch_tag) is int and INT64_MIN <= tail_launch_tag <= INT64_MAX
        else check_int64("tail_launch_tag", tail_launch_tag)
    )
    t = _for_store(
        "tail",
        validate_write_args,
        tail,
        plan_buffers,
        input_ids=h.input_ids,
        positions=h.positions,
        out_cache_loc=h.out_cache_loc,
        launch_tag=tag,
        real_kv=inputs.get("real_kv"),
    )
    st: CanaryStore = tail  # type: ignore[assignment]
    for name, e in (
        ("expected_input_ids", h.expected_input_ids),
        ("expected_positions", h.expected_positions),
    ):
        if e is not None:
            check_not_aliasing_store(name, e, st)
    return WritePairArgs(h, t)


def check_two_stores(head: object, tail: object) -> None:
    """A pair write's stores are two objects (``ValueError`` for one passed twice: both
    halves of the launch would write its records); the rest of the pair's checks are
    :func:`validate_write_pair_args`'."""
    if tail is head:
        raise ValueError(
            "kv-canary: tail must be another CanaryStore than head, got the same store twice "
            "(both halves of the launch would write its records)"
        )


def _for_store(which: str, check: Any, *args: Any, **kwargs: Any) -> Any:
    """``check(*args, **kwargs)``, its ``kv-canary:`` error saying which store of the pair
    it is about (``kv-canary: tail: store must be ...``)."""
    try:
        return check(*args, **kwargs)
    except (TypeError, ValueError) as err:
        text = str(err)
        if not text.startswith("kv-canary: "):
            raise
        raise type(err)(f"kv-canary: {which}: {text[len('kv-canary: ') :]}") from err


def write_pair_reference(
    head: CanaryStore,
    tail: CanaryStore,
    plan_buffers: PlanBuffers,
    *,
    tail_launch_tag: int = 0,
    **inputs: Unpack[WriteInputs],
) -> None:
    """:func:`write_reference` of ``head`` with ``inputs``, then of ``tail`` with the same
    ``input_ids``, ``positions``, ``out_cache_loc`` and ``real_kv``, ``tail_launch_tag``
    and no expected inputs: a step's HEAD and TAIL writes (what
    ``kv_canary_kernels.launch_write_pair`` does in one launch). Both are checked first
    (:func:`validate_write_pair_args`, then both stores' data): on a rejection neither
    store is written.

    Args:
        head, tail: two distinct :class:`CanaryStore` objects on one device.
        plan_buffers: the step's :class:`PlanBuffers`, filled by its plan.
        tail_launch_tag: int64, written into the TAIL store's violation rows.
        **inputs: :class:`WriteInputs` (int64 ``[n]`` ``input_ids``, ``positions``,
            ``out_cache_loc``; the HEAD's ``launch_tag`` and optional int64 ``[n]``
            expected inputs; ``real_kv``), as :func:`write_reference` takes them."""
    args = validate_write_pair_args(
        head, tail, plan_buffers, tail_launch_tag=tail_launch_tag, **inputs
    )
    for store in (head, tail):
        store.check(views=True)
    plan_buffers.check(views=True)
    # both stores' data checked before either is written (the tail's slots may lie past
    # its num_slots where the head's do not)
    checked = (_checked(head, plan_buffers, args.head), _checked(tail, plan_buffers, args.tail))
    _commit(head, *checked[0])
    _commit(tail, *checked[1])


# --- the split write: chain before the forward, stamp after it ------------------------------
class WriteChainArgs(NamedTuple):
    """The validated arguments of one chain call."""

    write: WriteArgs
    """The write's (``real_kv`` None)."""
    workspace: WriteWorkspace


class WriteStampArgs(NamedTuple):
    """The validated arguments of one stamp call."""

    n: int
    """The chain's ``len(out_cache_loc)``: the tokens the stamp looks at."""
    launch: int
    """The chain's launch number (``WriteWorkspace.last_chain``)."""
    real_kv: RealKV | None
    """None when no real-KV hash is taken (no object, mode NONE or no sources)."""


def _check_workspace(workspace: object, store: CanaryStore) -> WriteWorkspace:
    if type(workspace) is not WriteWorkspace:
        raise TypeError(
            "kv-canary: workspace must be a kv_canary_buffers.WriteWorkspace (build one with "
            f"WriteWorkspace.allocate), got {type(workspace).__name__}"
        )
    workspace.check()
    if workspace.arena.device != store.arena.device:
        raise ValueError(
            f"kv-canary: workspace must be on the store's device {store.device}, "
            f"got {workspace.device}"
        )
    if workspace.slot_capacity < store.num_slots:
        raise ValueError(
            f"kv-canary: workspace.slot_capacity must be >= store.num_slots = "
            f"{store.num_slots}, got {workspace.slot_capacity} (grow it before the chain: "
            "workspace = workspace.ensure_capacity(slots=store.num_slots))"
        )
    return workspace


def validate_write_chain_args(
    store: object,
    plan_buffers: object,
    workspace: object,
    *,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    launch_tag: int = 0,
    expected_input_ids: torch.Tensor | None = None,
    expected_positions: torch.Tensor | None = None,
) -> WriteChainArgs:
    """Every host-side check of one chain call (both chain paths run it first): the
    write's (:func:`validate_write_args`), and a :class:`WriteWorkspace` on the store's
    device holding ``n`` tokens and the store's slots, none of the inputs inside it.
    Reads no tensor data, never syncs, writes nothing (the launch is recorded by
    :func:`record_chain`, after the checks)."""
    args = validate_write_args(
        store,
        plan_buffers,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        launch_tag=launch_tag,
        expected_input_ids=expected_input_ids,
        expected_positions=expected_positions,
    )
    st: CanaryStore = store  # type: ignore[assignment]
    ws = _check_workspace(workspace, st)
    if args.n > ws.token_capacity:
        raise ValueError(
            f"kv-canary: workspace.token_capacity must be >= n = len(out_cache_loc) = "
            f"{args.n}, got {ws.token_capacity} (grow it before the chain: workspace = "
            "workspace.ensure_capacity(tokens=n))"
        )
    arena = ws.arena
    start, end = arena.base, arena.base + arena.nbytes
    n = args.n
    for ptr in args.addresses:
        if ptr < end and start < ptr + 8 * n:
            name = _WRITE_INPUT_NAMES[args.addresses.index(ptr)]
            raise ValueError(
                f"kv-canary: {name} must not share memory with the WriteWorkspace the chain "
                "writes, got a tensor inside the workspace's arena (pass the engine's own "
                "tensors)"
            )
    return new_tuple(WriteChainArgs, (args, ws))


def record_chain(store: CanaryStore, plan_buffers: PlanBuffers, args: WriteChainArgs) -> int:
    """Remember on the host the chain about to be launched on ``args.workspace`` (its
    store, plan buffers, generations and ``n``) and return its launch number (1, 2, ...
    per workspace: the chain writes it on the device, the stamp compares it)."""
    ws = args.workspace
    launch = next(ws.arena.launches)
    ws._last_chain[:] = (
        new_tuple(
            ChainFill,
            (
                store.arena._key,
                store.generation,
                plan_buffers.arena._key,
                plan_buffers.generation,
                launch,
                args.write.n,
                False,
            ),
        ),
    )
    return launch


def validate_write_stamp_args(
    store: object,
    plan_buffers: object,
    workspace: object,
    *,
    real_kv: RealKV | None = None,
) -> WriteStampArgs:
    """Every host-side check of one stamp call (both stamp paths run it first): the store
    and plan buffers (as the write's), ``real_kv`` (as the write's), and a workspace whose
    last chain was launched for this very store and plan buffers, at their current
    generations, and not yet stamped. Reads no tensor data, never syncs, writes nothing
    (:func:`record_stamp` marks the chain stamped, after the checks)."""
    if type(store) is not CanaryStore:
        check_store(store)  # raises the TypeError
    st: CanaryStore = store  # type: ignore[assignment]
    st.check()
    if type(plan_buffers) is not PlanBuffers:
        check_plan_buffers(plan_buffers)  # raises the TypeError
    bufs: PlanBuffers = plan_buffers  # type: ignore[assignment]
    bufs.check()
    if st.arena.device != bufs.arena.device:
        check_same_device(st, bufs)
    ws = _check_workspace(workspace, st)
    fill = ws.last_chain
    if fill is None or fill.stamped:
        got = (
            "a workspace no chain ran on"
            if fill is None
            else f"a workspace whose last chain (launch {fill.launch}) was already stamped"
        )
        raise ValueError(
            "kv-canary: workspace must hold a chain not yet stamped (launch_write_chain or "
            f"write_chain_reference on it for this step, before the forward), got {got}"
        )
    # (its common case in one test; _raise_not_the_chains words the failing object)
    store_key, store_generation, plan_key, plan_generation, launch, n, _ = fill
    if (
        st.arena._key != store_key
        or st.generation != store_generation
        or bufs.arena._key != plan_key
        or bufs.generation != plan_generation
    ):
        _raise_not_the_chains(st, bufs, fill)
    kv = None if real_kv is None else check_real_kv(real_kv, st)
    return new_tuple(WriteStampArgs, (n, launch, kv))


def _raise_not_the_chains(
    store: CanaryStore, plan_buffers: PlanBuffers, fill: ChainFill
) -> NoReturn:
    """Word the stamp's refusal of a store or plan buffers other than its chain's."""
    for name, obj, key, generation in (
        ("store", store, fill.store, fill.store_generation),
        ("plan_buffers", plan_buffers, fill.plan, fill.plan_generation),
    ):
        if obj.arena._key != key or obj.generation != generation:
            kind = type(obj).__name__
            raise ValueError(
                f"kv-canary: {name} must be the {kind} the workspace's chain (launch "
                f"{fill.launch}) ran with (generation {generation}), got another {kind} "
                f"(generation {obj.generation}): run the chain with the stamp's store and "
                "plan buffers, after any resize"
            )
    raise AssertionError("kv-canary: internal error: the stamp's identity check failed alone")


def record_stamp(workspace: WriteWorkspace) -> None:
    """Mark the workspace's last chain stamped (a second stamp of it is refused)."""
    fill = workspace._last_chain[0]
    workspace._last_chain[:] = (new_tuple(ChainFill, (*fill[:-1], True)),)


STAMP_CONSUMED = MAX_CAPACITY
"""``stamp_tickets`` after a torch stamp: past any stamp grid's program count, so that no
later stamp, torch or Triton, takes the fill for fresh (the kernel's programs each add 1
to the word a chain zeroed, and are fresh below their own count)."""


def _write_chain(store: CanaryStore, workspace: WriteWorkspace, chain: _Chain) -> None:
    kept = chain.written.nonzero().squeeze(1)
    index = chain.indices.index_select(0, kept)
    slots = chain.slots.index_select(0, kept)
    fill = workspace.fill
    number = fill + 1
    entries = torch.stack(
        [c.index_select(0, kept) for c in (chain.tokens, chain.positions, chain.chain_at)]
        + [slots],
        dim=1,
    )
    # Per token index one entry (rows do not share indices on valid data).
    workspace.entries.index_copy_(0, index, entries)
    workspace.entry_owners.index_copy_(0, index, chain.requests.index_select(0, kept))
    workspace.entry_fills.index_fill_(0, index, number[0])
    # Per slot its last index: rows write in ascending index, and do not share slots.
    last = workspace.last_token
    order = torch.full((workspace.slot_capacity,), -1, dtype=torch.int64, device=last.device)
    order.scatter_reduce_(0, slots, index, reduce="amax")
    hit = order >= 0
    last.copy_(torch.where(hit, order.to(last.dtype), last))
    fill.copy_(number)
    workspace.chain_tickets.zero_()
    workspace.stamp_tickets.zero_()
    _append(store, chain.rows)


def _check_fresh(workspace: WriteWorkspace, args: WriteStampArgs) -> int:
    """The workspace's fill number, refused unless it holds the fresh chain of launch
    ``args.launch`` (the device-side test the stamp kernel makes; reads the device)."""
    fill = int(workspace.fill.item())
    launch = int(workspace.chain_launch.item())
    tickets = int(workspace.stamp_tickets.item())
    if fill < 1 or launch != args.launch or tickets != 0:
        raise ValueError(
            f"kv-canary: workspace must hold the fresh fill of chain launch {args.launch}, "
            f"got chain_launch = {launch}, stamp_tickets = {tickets}, fill = {fill} (a "
            "stamp repeated or a chain skipped on the device: the kernels stamp nothing "
            "and raise CanaryStatus.WRITE_CHAIN_STALE)"
        )
    return fill


def _write_stamp(
    store: CanaryStore, workspace: WriteWorkspace, args: WriteStampArgs, fill: int
) -> None:
    n = args.n
    index = (workspace.entry_fills[:n] == fill).nonzero().squeeze(1)
    written = index.numel()  # every record stored, a slot's earlier ones included
    entries = workspace.entries.index_select(0, index)
    slots = entries[:, ENTRY_SLOT]
    final = workspace.last_token.index_select(0, slots).to(torch.int64) == index
    index, entries, slots = index[final], entries[final], slots[final]
    kv = _real_kv_of(args.real_kv, slots, torch.ones_like(slots, dtype=torch.bool), index)
    owners = workspace.entry_owners.index_select(0, index)
    # Checked: from here on the store is written. The entries are in index order, which
    # is each row's order; a slot's last entry is the only one kept.
    _stamp(store, slots, (entries[:, 0], entries[:, 1], entries[:, 2], owners), kv, written)
    workspace.stamp_tickets.fill_(STAMP_CONSUMED)


def write_chain_reference(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    **inputs: Unpack[WriteChainInputs],
) -> None:
    """The split write's first stage, before the forward (docs/contract-canary.md, "Write,
    split"): each row's hash chain and the write checks that need no KV bytes, their
    violation rows appended to ``store``'s ring (with their context), and per stamped token
    its entry in ``workspace`` (token, position, the chain hash before it, slot, owner).
    Writes no record: :func:`write_stamp_reference` does, after the forward.

    Raises what :func:`write_reference` raises (nothing written then), and for a
    workspace that is not a :class:`WriteWorkspace`, on another device, or too small
    (``token_capacity < n`` or ``slot_capacity < store.num_slots``)."""
    args = validate_write_chain_args(store, plan_buffers, workspace, **inputs)
    store.check(views=True)
    plan_buffers.check(views=True)
    workspace.check(views=True)
    chain = _chain(store, plan_buffers, args.write)  # data out of range raises here
    # Everything is checked: from here on the workspace and the ring are written.
    launch = record_chain(store, plan_buffers, args)
    workspace.chain_launch.fill_(launch)
    _write_chain(store, workspace, chain)


def write_stamp_reference(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    **inputs: Unpack[WriteStampInputs],
) -> None:
    """The split write's second stage, after the forward: each record the chain prepared
    in ``workspace``, with the hash of the KV bytes (``real_kv``), and its owner; the
    padding bit, ``kernel_runs`` (+1 for the pair) and ``slots_processed``. With
    :func:`write_chain_reference` before it, equal to one :func:`write_reference` call on
    the same inputs, byte for byte.

    Raises ``TypeError`` / ``ValueError`` for a wrong argument, a workspace whose last
    chain ran with another store or plan buffers (or generation) or was already stamped,
    and what :func:`write_reference` raises for ``real_kv``; nothing is written then."""
    args = validate_write_stamp_args(store, plan_buffers, workspace, **inputs)
    store.check(views=True)
    workspace.check(views=True)
    fill = _check_fresh(workspace, args)
    _write_stamp(store, workspace, args, fill)  # a real-KV error raises before it writes
    record_stamp(workspace)
