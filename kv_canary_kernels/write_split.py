"""The split write: ``canary_write_chain_kernel`` before the forward, and
``canary_write_stamp_kernel`` after it (launchers: :mod:`.launch`).

The write's serial part, each row's hash chain, needs only the tokens, positions and seed
records, all known before the forward; only the real-KV hash needs the bytes the forward
writes. So the chain runs first, on a side stream beside the forward, and the stamp,
after the forward, is parallel over tokens: its time does not depend on row length.

**Chain** (one lane a row, rows strided across the programs as the write's chain
programs are, so that long rows each walk in a warp of their own; the walk of
:mod:`.write`'s chain programs, two tokens in flight ahead): for each token of a busy row
whose slot is in the store, its *entry* in the workspace at the token's index ``i``
(``TOKEN``, ``POSITION``, the chain hash before it, the slot), the row's request
(``entry_owners[i]``), the fill number (``entry_fills[i]``) and ``last_token[slot] = i``;
the write checks (expected inputs, chain position) and their violation rows with their
context (appended from a replay of the failing lanes only, as the write does); the status
bits of data out of range (seed, index, slot, row count). It writes no record.

**Stamp** (one lane a token ``i < n``): an entry of the current fill whose slot's
``last_token`` is ``i`` (a slot written twice within a row keeps the later record) is
stamped: ``records[slot] = (TOKEN, POSITION, PREV_HASH, real_kv(slot))`` and
``owners[slot]``, with ``PADDING_SLOT_WRITTEN`` for slot 0; ``slots_processed`` counts
every entry of the fill (a duplicate's earlier ones too, as the write's count does) and
program 0 adds the pair's ``kernel_runs``.

**Fills and freshness.** The entries of one chain launch carry its fill number, so that
a stamp never takes an entry another fill left at an index this step does not write. The
number lives on the device (a graph replays one launch's arguments): each chain program
reads ``fill`` at its start and writes ``fill + 1`` beside its entries, and the last
program to finish (its ticket on ``chain_tickets``, taken after a barrier with acq_rel
order, so every program's read of ``fill`` precedes it) stores ``fill + 1`` and zeroes
the tickets. Program 0 also zeroes ``stamp_tickets`` and writes the host launch number
into ``chain_launch``. Each stamp program takes a ticket on ``stamp_tickets``: the first
stamp after a chain gets tickets below its program count, any later one (a replay of the
stamp without its chain) above; with ``chain_launch`` equal to its own launch number,
that is *fresh*. A stamp that is not fresh stamps and counts nothing and raises
``CanaryStatus.WRITE_CHAIN_STALE`` (program 0): never a silent stale stamp. Every stamp
takes its tickets, fresh or not, so a fill is stamped at most once (a foreign stamp
replayed after a chain leaves that step unstamped, and flagged).

The one case where the pair differs from ``launch_write``: a slot whose real-KV page row
lies past a source (refused at every launch's door, so reachable only behind it) is
skipped by the stamp with ``REAL_KV_ROW_OUT_OF_RANGE``, but the chain, which has no
sources, advanced over it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.real_kv import RealKV
from kv_canary_buffers.store import CanaryStore
from kv_canary_buffers.workspace import WriteWorkspace
from kv_canary_buffers.write import WriteArgs, WriteStampArgs

from . import config, fast_launch
from .config import INTERPRETING
from .constants import (
    CHAIN_STALE,
    DUMMY_SLOT,
    ENTRY_SLOT,
    ENTRY_W,
    PADDING_WRITTEN,
    PLAN_COUNT_BAD,
    REC_POSITION,
    REC_PREV_HASH,
    REC_REAL_KV,
    REC_TOKEN,
    REC_W,
    WRITE_POSITION_BIT,
    WRITE_SLOT_BAD,
    WRITE_TOKEN_BIT,
)
from .fast_launch import (
    FastPath,
    Launcher,
    addresses,
    cdiv,
    check_views,
    current_device,
    stream_of,
)
from .records import append_violations, i64, mix3, raise_status, real_kv_or_zero
from .sources import source_args
from .write import CHAIN_UNROLL, _row_spans, _seed_hash, _token_at

_CHAIN_INTS = [
    "n",
    "write_capacity",
    "num_slots",
    "violation_capacity",
    "launch_tag",
    "launch",
    "programs",
]
_STAMP_INTS = ["n", "num_slots", "launch", "programs", "num_sources"]


@triton.jit
def _chain_steps(
    inputs, store, ws, row, check_pos, ahead, state, num_slots, launch_tag, fill,
    HAS_EXPECTED: tl.constexpr, APPEND: tl.constexpr, UNROLL: tl.constexpr,
    SLEEP_NS: tl.constexpr,
):  # fmt: skip
    """Each lane's row walk (``row``: ``(first, length, request)``), two tokens in flight
    ahead (``ahead``, as :func:`.write._token_at` returns them); ``state`` is ``(running,
    flags, expect, suspect, prev_pos)`` as in :func:`.write._steps`. ``APPEND`` False:
    write the entries, raise the slot bits, note the lanes that met a failing token in
    ``suspect`` (the position check against one counter, as the write's first walk);
    ``APPEND`` True: the same walk appending those tokens' violation rows, writing
    nothing else. ``ws``: the workspace's ``(entries_ptr, entry_owners_ptr,
    entry_fills_ptr, last_token_ptr)``."""
    entries_ptr, entry_owners_ptr, entry_fills_ptr, last_token_ptr = ws
    first, length, request = row
    s0, t0, p0, et0, ep0 = ahead[0]
    s1, t1, p1, et1, ep1 = ahead[1]
    running, flags, expect, suspect, prev_pos = state
    longest = tl.max(length, 0)
    for step in tl.range(0, longest, loop_unroll_factor=UNROLL):
        s2, t2, p2, et2, ep2 = _token_at(inputs, first + step + 2, length > step + 2, HAS_EXPECTED)
        live = (step < length) & (s0 >= 0)
        slot_bad = live & (s0 >= num_slots)
        ok = live & ~slot_bad
        chain = i64(running)
        # The chain first: everything below is off its critical path.
        running = tl.where(ok, mix3(running, t0, p0, LATENCY=True), running)
        if HAS_EXPECTED:
            bits = tl.where(t0 != et0, WRITE_TOKEN_BIT, 0) | tl.where(
                p0 != ep0, WRITE_POSITION_BIT, 0
            )
        else:
            bits = tl.zeros_like(flags)
        checked = ok & check_pos
        if APPEND:
            want = prev_pos + 1
            if HAS_EXPECTED:
                append_violations(
                    ok & (bits != 0),
                    (launch_tag, s0, p0, t0, et0, chain, ep0, bits),
                    (request, ep0, request),
                    store,
                )
            append_violations(
                checked & (p0 != want),
                (
                    launch_tag, s0, p0, t0, t0, chain, want,
                    tl.full(flags.shape, WRITE_POSITION_BIT, tl.int32),
                ),
                (request, want, request),
                store,
            )  # fmt: skip
            prev_pos = tl.where(checked, p0, prev_pos)
        else:
            flags |= tl.where(slot_bad, WRITE_SLOT_BAD, 0)
            index = first + step
            entry = entries_ptr + index * ENTRY_W
            tl.store(entry + REC_TOKEN, t0, mask=ok)
            tl.store(entry + REC_POSITION, p0, mask=ok)
            tl.store(entry + REC_PREV_HASH, chain, mask=ok)
            tl.store(entry + ENTRY_SLOT, s0, mask=ok)
            tl.store(entry_owners_ptr + index, request, mask=ok)
            tl.store(entry_fills_ptr + index, tl.zeros_like(index) + fill, mask=ok)
            # The lane's own stores to one slot land in its program order: the last wins.
            tl.store(last_token_ptr + s0, index.to(tl.int32), mask=ok)
            suspect |= (ok & (bits != 0)) | (checked & (p0 != expect))
            expect += ok.to(tl.int64)
        s0, t0, p0, et0, ep0 = s1, t1, p1, et1, ep1
        s1, t1, p1, et1, ep1 = s2, t2, p2, et2, ep2
        if SLEEP_NS > 0:  # (pruned at 0: the default compiles as without it)
            running = _after_sleep(running, SLEEP_NS)
    return running, flags, expect, suspect, prev_pos


@triton.jit
def _after_sleep(x, SLEEP_NS: tl.constexpr):
    """``x`` (the running hash, uint64), after the lane's warp slept ``SLEEP_NS`` ns
    (``nanosleep``): the walk's next token depends on it, so it waits for the sleep."""
    return tl.inline_asm_elementwise(
        asm=f"nanosleep.u32 {SLEEP_NS}; mov.b64 $0, $1;",
        constraints="=l,l",
        args=[x],
        dtype=x.dtype,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _chain_walk(
    inputs, store, ws, row, seeds, check_pos, prev_pos, flags, num_slots, launch_tag, fill,
    HAS_EXPECTED: tl.constexpr, APPEND: tl.constexpr, UNROLL: tl.constexpr,
    SLEEP_NS: tl.constexpr,
):  # fmt: skip
    """One walk of every lane's row from its seed (``seeds``: ``(has_seed,
    seed_position, seed_record)``): the flags and the suspect lanes."""
    first, length, _ = row
    has_seed, seed_position, seed_record = seeds
    ahead = (
        _token_at(inputs, first, length > 0, HAS_EXPECTED),
        _token_at(inputs, first + 1, length > 1, HAS_EXPECTED),
    )
    running = _seed_hash(has_seed, seed_record, seed_position)
    suspect = tl.zeros_like(length) != 0
    state = (running, flags, prev_pos + 1, suspect, prev_pos)
    # Rolled in the replay (only on a violation): its loop is not the chain's speed.
    STEP_UNROLL: tl.constexpr = 1 if APPEND else UNROLL
    # The replay (only on a violation) at full speed: it is not beside a forward's kernels
    # for long.
    STEP_SLEEP: tl.constexpr = 0 if APPEND else SLEEP_NS
    _, flags, _, suspect, _ = _chain_steps(
        inputs, store, ws, row, check_pos, ahead, state, num_slots, launch_tag, fill,
        HAS_EXPECTED, APPEND, STEP_UNROLL, STEP_SLEEP,
    )  # fmt: skip
    return flags, suspect


@triton.jit(do_not_specialize=_CHAIN_INTS)
def canary_write_chain_kernel(
    # the step's inputs
    input_ids_ptr,
    positions_ptr,
    out_cache_loc_ptr,
    expected_input_ids_ptr,
    expected_positions_ptr,
    # the plan
    write_offsets_ptr,
    write_seed_slot_indices_ptr,
    write_num_valid_reqs_ptr,
    row_req_pool_indices_ptr,
    # the store (read: the seeds' records and the flag; written: the ring and the status)
    records_ptr,
    violations_ptr,
    violation_count_ptr,
    chain_position_check_ptr,
    status_ptr,
    violation_context_ptr,
    # the workspace
    entries_ptr,
    entry_owners_ptr,
    entry_fills_ptr,
    last_token_ptr,
    fill_ptr,
    chain_tickets_ptr,
    stamp_tickets_ptr,
    chain_launch_ptr,
    # runtime sizes (int64 whatever their values: one compiled variant for all)
    n: tl.int64,
    write_capacity: tl.int64,
    num_slots: tl.int64,
    violation_capacity: tl.int64,
    launch_tag: tl.int64,
    launch: tl.int64,
    programs: tl.int64,
    HAS_EXPECTED: tl.constexpr,
    ROWS: tl.constexpr,
    UNROLL: tl.constexpr,
    SLEEP_NS: tl.constexpr,
):
    inputs = (
        input_ids_ptr,
        positions_ptr,
        out_cache_loc_ptr,
        expected_input_ids_ptr,
        expected_positions_ptr,
    )
    # append_violations' store group; the owners' place (never read there) holds records.
    store = (
        records_ptr,
        violations_ptr,
        violation_count_ptr,
        violation_capacity,
        records_ptr,
        violation_context_ptr,
    )
    ws = (entries_ptr, entry_owners_ptr, entry_fills_ptr, last_token_ptr)
    pid = tl.program_id(0)
    fill = tl.load(fill_ptr) + 1  # this launch's fill number (read before the ticket below)
    raw_rows = tl.load(write_num_valid_reqs_ptr).to(tl.int64)
    num_rows = tl.minimum(tl.maximum(raw_rows, 0), write_capacity)
    lanes = tl.arange(0, ROWS)
    # Rows strided across the programs: long rows each walk in a warp of their own.
    rows = pid + lanes.to(tl.int64) * programs
    first, length, request, _, has_seed, seed_position, seed_record, flags = _row_spans(
        write_offsets_ptr,
        write_seed_slot_indices_ptr,
        row_req_pool_indices_ptr,
        records_ptr,
        rows,
        num_rows,
        write_capacity,
        n,
        num_slots,
    )
    flags |= tl.where(
        (rows == 0) & ((raw_rows < 0) | (raw_rows > write_capacity)), PLAN_COUNT_BAD, 0
    )
    seeds = (has_seed, seed_position, seed_record)
    # The flag loaded per lane (one word, broadcast): see the write kernel.
    check_pos = has_seed & (tl.load(chain_position_check_ptr + tl.zeros_like(rows)) != 0)
    prev_pos = tl.where(check_pos, seed_position, 0)
    row = (first, length, request)
    flags, suspect = _chain_walk(
        inputs, store, ws, row, seeds, check_pos, prev_pos, flags, num_slots, launch_tag,
        fill, HAS_EXPECTED, False, UNROLL, SLEEP_NS,
    )  # fmt: skip
    if tl.max(suspect.to(tl.int32), 0) != 0:
        _chain_walk(
            inputs, store, ws, (first, tl.where(suspect, length, 0), request), seeds,
            check_pos, prev_pos, flags, num_slots, launch_tag, fill,
            HAS_EXPECTED, True, UNROLL, SLEEP_NS,
        )  # fmt: skip
    raise_status(status_ptr, flags)
    if pid == 0:
        tl.store(chain_launch_ptr, launch)
        tl.store(stamp_tickets_ptr, 0)
    # The last program to take a ticket publishes the fill number: every program read
    # ``fill`` before its ticket (the barrier orders the block's reads before it, acq_rel
    # the programs' tickets), so none reads the new number.
    tl.debug_barrier()
    ticket = tl.atomic_add(chain_tickets_ptr, 1, sem="acq_rel")
    if ticket == programs - 1:
        tl.store(fill_ptr, fill)
        tl.store(chain_tickets_ptr, 0)


@triton.jit(do_not_specialize=_STAMP_INTS)
def canary_write_stamp_kernel(
    # the workspace
    entries_ptr,
    entry_owners_ptr,
    entry_fills_ptr,
    last_token_ptr,
    fill_ptr,
    stamp_tickets_ptr,
    chain_launch_ptr,
    # the store
    records_ptr,
    kernel_runs_ptr,
    slots_processed_ptr,
    status_ptr,
    owners_ptr,
    # real-KV sources (a RealKV's source table)
    source_table_ptr,
    n: tl.int64,
    num_slots: tl.int64,
    launch: tl.int64,
    programs: tl.int64,
    num_sources: tl.int64,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    # Issued together (one round trip): the ticket, the fill's words and the lanes' whole
    # entries (the record's first three columns and the owner too: loaded under the final
    # mask below, they were a third round trip), whatever the fill (in bounds: i < n <=
    # token_capacity); only the stores wait for the mask.
    ticket = tl.atomic_add(stamp_tickets_ptr, 1, sem="relaxed")
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    in_n = i < n
    fill = tl.load(fill_ptr)
    mark = tl.load(chain_launch_ptr)
    tags = tl.load(entry_fills_ptr + i, mask=in_n, other=0)
    entry = entries_ptr + i * ENTRY_W
    slot = tl.load(entry + ENTRY_SLOT, mask=in_n, other=-1)
    token = tl.load(entry + REC_TOKEN, mask=in_n)
    position = tl.load(entry + REC_POSITION, mask=in_n)
    prev_hash = tl.load(entry + REC_PREV_HASH, mask=in_n)
    owner = tl.load(entry_owners_ptr + i, mask=in_n, other=0)
    fresh = (ticket < programs) & (mark == launch) & (fill >= 1)  # the same in every program
    # As a lane vector (a scalar bool combined with lanes can come out as int32 in
    # Triton's interpreter, and a mask must be bool).
    fresh_lanes = (tl.zeros_like(i) + fresh.to(tl.int64)) != 0
    live = in_n & fresh_lanes & (tags == fill) & (slot >= 0) & (slot < num_slots)
    # The second round trip: the slot's last index and its KV bytes, side by side.
    last = tl.load(last_token_ptr + slot, mask=live, other=-1)
    flags = tl.zeros([BLOCK], tl.int32)
    kv_hash, ok, flags = real_kv_or_zero(
        slot, live, flags, (source_table_ptr, num_sources), MODE, CHUNK
    )
    final = ok & (last.to(tl.int64) == i)
    flags |= tl.where(final & (slot == DUMMY_SLOT), PADDING_WRITTEN, 0)
    # Column by column in the lanes' own layout (a [BLOCK, 4] tile would go through
    # shared memory to meet it): the entry's first three columns, then the hash in the
    # place of its slot.
    rec = records_ptr + slot * REC_W
    tl.store(rec + REC_TOKEN, token, mask=final)
    tl.store(rec + REC_POSITION, position, mask=final)
    tl.store(rec + REC_PREV_HASH, prev_hash, mask=final)
    tl.store(rec + REC_REAL_KV, kv_hash, mask=final)
    tl.store(owners_ptr + slot, owner, mask=final)
    total = tl.sum(ok.to(tl.int64), 0)  # every record stored, a slot's earlier ones too
    if total > 0:
        tl.atomic_add(slots_processed_ptr, total, sem="relaxed")
    raise_status(status_ptr, flags)
    if pid == 0:
        if fresh:
            tl.atomic_add(kernel_runs_ptr, 1, sem="relaxed")
        else:
            tl.atomic_or(status_ptr, CHAIN_STALE, sem="relaxed")


def chain_programs(capacity: int) -> int:
    """The chain's grid: enough that up to ``write_chain_programs`` long rows each walk in
    a warp of their own, never more programs than rows (one a warp of ``write_rows``
    lanes under the interpreter, whose programs each cost host time)."""
    cfg = config.active.launch
    fewest = 1 if INTERPRETING else cfg.write_chain_programs
    return min(capacity, max(cdiv(capacity, cfg.write_rows), fewest))


def stamp_programs(n: int) -> int:
    """The stamp's grid: one lane a token, at least one program (it counts the run)."""
    return max(1, cdiv(n, config.active.launch.write_stamp_block))


def _chain_key(
    store: object,
    buffers: object,
    workspace: object,
    variant: int,
    has_expected: bool,
    aligned: bool | tuple[bool, ...],
) -> tuple[object, ...] | None:
    """The chain's :class:`~.fast_launch.FastPath` key (as ``fast_launch.stage_key``: the
    three arenas' construction-time keys, the config's number and the compiled variant's
    flags), or None where the full path must run (the interpreter; a ``torch.compile``
    copy of an arena)."""
    if (
        not fast_launch.FAST_PATH
        or type(store) is not CanaryStore
        or type(buffers) is not PlanBuffers
        or type(workspace) is not WriteWorkspace
    ):
        return None
    return (
        store.arena._key,
        buffers.arena._key,
        workspace.arena._key,
        variant,
        has_expected,
        aligned,
    )


def dispatch_write_chain(
    store: CanaryStore,
    buffers: PlanBuffers,
    workspace: WriteWorkspace,
    args: WriteArgs,
    launch: int,
) -> None:
    """Launch the chain kernel on validated arguments (no check at all).

    The chain keeps the write's host fast path, as the stamp does: after the first launch
    of a (store, plan buffers, workspace, config, variant), the fixed tensors' addresses,
    the grid and the sizes are kept, and later launches pass them with the inputs'
    addresses (read by the validation), ``n``, the tag and the launch number (the
    validation's ``check()`` of the three objects proves those arenas still in place and
    the objects')."""
    variant, cfg = config.active
    has_expected = args.expected_input_ids is not None
    # Triton assumes what it saw of the inputs' 16-byte alignment at a variant's compile;
    # the workspace's, the plan's and the store's fields are aligned by construction.
    aligned = True if args.aligned else tuple(p % 16 == 0 for p in args.addresses)
    fast_key = _chain_key(store, buffers, workspace, variant, has_expected, aligned)
    if fast_key is not None:
        hit = _FAST_CHAIN.get(fast_key)
        if hit is not None:
            index, programs, go, fixed, sizes = hit
            if index == current_device():
                go(
                    programs, stream_of(index), *args.addresses, *fixed, args.n, *sizes,
                    args.launch_tag, launch, programs,
                )  # fmt: skip
                return
    check_views(store, buffers)  # their views go to Triton as tensors below
    if type(workspace) is WriteWorkspace:
        workspace.check(views=True)
    exp_ids = args.input_ids if args.expected_input_ids is None else args.expected_input_ids
    exp_pos = args.positions if args.expected_positions is None else args.expected_positions
    capacity = buffers.write_req_capacity
    programs = chain_programs(capacity)
    fixed = (
        buffers.write_offsets,
        buffers.write_seed_slot_indices,
        buffers.write_num_valid_reqs,
        buffers.row_req_pool_indices,
        store.records,
        store.violations,
        store.violation_count,
        store.chain_position_check,
        store.status,
        store.violation_context,
        workspace.entries,
        workspace.entry_owners,
        workspace.entry_fills,
        workspace.last_token,
        workspace.fill,
        workspace.chain_tickets,
        workspace.stamp_tickets,
        workspace.chain_launch,
    )
    sizes = (capacity, store.num_slots, store.violation_capacity)
    go = _CHAIN.launch(
        store.device,
        (programs, 1, 1),
        (variant, has_expected, aligned),
        (
            args.input_ids,
            args.positions,
            args.out_cache_loc,
            exp_ids,
            exp_pos,
            *fixed,
            args.n,
            *sizes,
            args.launch_tag,
            launch,
            programs,
        ),
        {
            "HAS_EXPECTED": has_expected,
            "ROWS": cfg.write_rows,
            "UNROLL": CHAIN_UNROLL[has_expected],
            "SLEEP_NS": cfg.write_chain_sleep_ns,
        },
        {"num_warps": cfg.write_warps}
        if not cfg.write_chain_maxnreg
        else {"num_warps": cfg.write_warps, "maxnreg": cfg.write_chain_maxnreg},
    )
    if go is not None and fast_key is not None:
        _FAST_CHAIN.remember(fast_key, (store.device.index, programs, go, addresses(fixed), sizes))


def _stamp_key(
    store: object, workspace: object, real_kv: object, variant: int
) -> tuple[object, ...] | None:
    """The stamp's :class:`~.fast_launch.FastPath` key (as ``fast_launch.stage_key``: the
    arenas' construction-time keys, the sources' handle, the config's number), or None
    where the full path must run (the interpreter; a ``torch.compile`` copy)."""
    if (
        not fast_launch.FAST_PATH
        or type(store) is not CanaryStore
        or type(workspace) is not WriteWorkspace
        or not (real_kv is None or type(real_kv) is RealKV)
    ):
        return None
    handle = 0 if real_kv is None else real_kv._handle
    return (store.arena._key, workspace.arena._key, handle, variant)


def dispatch_write_stamp(
    store: CanaryStore, workspace: WriteWorkspace, args: WriteStampArgs
) -> None:
    """Launch the stamp kernel on validated arguments (no check at all).

    The stamp is on the step's critical path, so it keeps the write's host fast path:
    after the first launch of a (store, workspace, sources, config), the fixed tensors'
    addresses are kept and later launches pass them with their own ``n``, launch number
    and grid (the validation's ``check()`` of the store and the workspace proves those
    arenas still in place and the objects')."""
    variant, cfg = config.active
    programs = stamp_programs(args.n)
    fast_key = _stamp_key(store, workspace, args.real_kv, variant)
    if fast_key is not None:
        hit = _FAST_STAMP.get(fast_key)
        if hit is not None:
            index, go, fixed, num_slots, num_sources = hit
            if index == current_device():
                go(
                    programs, stream_of(index), *fixed, args.n, num_slots, args.launch,
                    programs, num_sources,
                )  # fmt: skip
                return
    check_views(store)
    if type(workspace) is WriteWorkspace:
        workspace.check(views=True)
    src = source_args(args.real_kv, store.records)
    fixed = (
        workspace.entries,
        workspace.entry_owners,
        workspace.entry_fills,
        workspace.last_token,
        workspace.fill,
        workspace.stamp_tickets,
        workspace.chain_launch,
        store.records,
        store.kernel_runs,
        store.slots_processed,
        store.status,
        store.owners,
        src.table,
    )
    go = _STAMP.launch(
        store.device,
        (programs, 1, 1),
        (variant, src.mode),
        (*fixed, args.n, store.num_slots, args.launch, programs, src.num_sources),
        {"MODE": src.mode, "BLOCK": cfg.write_stamp_block, "CHUNK": cfg.real_kv_chunk},
        {"num_warps": cfg.write_stamp_warps},
    )
    if go is not None and fast_key is not None:
        _FAST_STAMP.remember(
            fast_key,
            (store.device.index, go, addresses(fixed), store.num_slots, src.num_sources),
        )


_CHAIN = Launcher(canary_write_chain_kernel)
_STAMP = Launcher(canary_write_stamp_kernel)
_FAST_CHAIN = FastPath()
_FAST_STAMP = FastPath()
