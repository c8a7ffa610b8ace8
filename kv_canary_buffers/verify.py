"""The verify stage in torch: its arguments, their host-side checks and the reference.

- :func:`validate_verify_args` (-> :class:`VerifyArgs`): every host-side check of one
  verify call, run first by both verify paths (``verify_reference`` here,
  ``launch_verify`` in ``kv_canary_kernels``); reads no tensor data and never syncs.
- :func:`verify_reference`: the torch verify stage, the CPU path and the verify kernel's
  oracle. It follows docs/contract-canary.md ("Verify") with no Python loop over entries.
  It reads tensor data, so on a GPU it synchronizes: an oracle and a CPU path, not
  something to capture.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict

import torch
from typing_extensions import Unpack

from .buffers import PlanBuffers
from .checks import check_bool, check_int64, new_tuple
from .layout import (
    INT64_MAX,
    INT64_MIN,
    POSITION,
    PREV_HASH,
    REAL_KV_HASH,
    RECORD_DTYPE,
    TOKEN,
    UNCHECKED_TOKEN,
)
from .real_kv import RealKV, first_row_past_sources, real_kv_hash
from .records import (
    append_rows,
    chain_hash_of,
    check_plan_buffers,
    check_real_kv,
    check_same_device,
    check_store,
    plan_count,
    raise_bad,
    request_of_entries,
)
from .status import FailBits
from .store import CanaryStore


# --- arguments and their checks ---------------------------------------------------------
class VerifyInputs(TypedDict, total=False):
    """The verify's keyword arguments, one definition for every verify entry point
    (``verify_reference``, ``kv_canary_kernels.launch_verify``, their ``torch.compile``
    operator): ``**inputs: Unpack[VerifyInputs]``. Their defaults are
    :func:`validate_verify_args`'s."""

    launch_tag: int
    """int64 written into every violation row of this call (default 0)."""
    check_expected_tokens: bool
    """compare each record's token with the plan's expected token (default True; ``-1``
    entries are never compared); off for the background sweep."""
    real_kv: RealKV | None
    """optional :class:`RealKV`; its hash of each slot's bytes is compared with the one
    the write stored."""


class VerifyArgs(NamedTuple):
    """The validated arguments of one verify call."""

    launch_tag: int
    check_expected_tokens: bool
    real_kv: RealKV | None


def validate_verify_args(
    store: object,
    plan_buffers: object,
    *,
    launch_tag: int = 0,
    check_expected_tokens: bool = True,
    real_kv: RealKV | None = None,
) -> VerifyArgs:
    """Every host-side check of one verify call (both verify paths run it first)."""
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
    tag = (
        launch_tag
        if type(launch_tag) is int and INT64_MIN <= launch_tag <= INT64_MAX
        else check_int64("launch_tag", launch_tag)
    )
    check = (
        check_expected_tokens
        if type(check_expected_tokens) is bool
        else check_bool("check_expected_tokens", check_expected_tokens)
    )
    kv = None if real_kv is None else check_real_kv(real_kv, st)
    return new_tuple(VerifyArgs, (tag, check, kv))


# --- the torch reference ------------------------------------------------------------------
def _verify(store: CanaryStore, buffers: PlanBuffers, args: VerifyArgs) -> None:
    if int(buffers.verify_enable.item()) == 0:  # overflowed or write-only: nothing checked
        store.kernel_runs.add_(1)
        store.verify_skipped.add_(1)
        return
    num_slots = store.num_slots
    n = plan_count(buffers, "verify_num_valid", buffers.verify_capacity)
    slots_all = buffers.verify_slot_indices[:n]
    looked = (slots_all != 0).nonzero().squeeze(1)  # slot 0 is the padding slot
    slots = slots_all.index_select(0, looked)
    bad = (slots < 0) | (slots >= num_slots)
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise_bad(
            "plan_buffers.verify_slot_indices",
            int(looked[k]),
            int(slots[k]),
            f"in [0, num_slots = {num_slots})",
        )
    prev = buffers.verify_prev_slot_indices.index_select(0, looked)
    bad = prev >= num_slots
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise_bad(
            "plan_buffers.verify_prev_slot_indices",
            int(looked[k]),
            int(prev[k]),
            f"< num_slots = {num_slots}",
        )
    past = first_row_past_sources(args.real_kv, slots)
    if past is not None:
        raise_bad(
            "plan_buffers.verify_slot_indices",
            int(looked[past]),
            int(slots[past]),
            "a slot whose real-KV page row lies inside every source",
        )

    rec = store.records.index_select(0, slots)
    reachable = prev != 0
    expected_chain = torch.where(reachable, chain_hash_of(store.records, prev), rec[:, PREV_HASH])
    if args.check_expected_tokens:
        expected_token = buffers.verify_expected_tokens.index_select(0, looked)
    else:
        expected_token = torch.full_like(slots, UNCHECKED_TOKEN)
    positions = buffers.verify_expected_positions.index_select(0, looked)
    kv = real_kv_hash(args.real_kv, slots)
    bits = (
        torch.where(reachable & (rec[:, PREV_HASH] != expected_chain), int(FailBits.CHAIN), 0)
        | torch.where(rec[:, POSITION] != positions, int(FailBits.POSITION), 0)
        | torch.where(rec[:, REAL_KV_HASH] != kv, int(FailBits.REAL_KV), 0)
        | torch.where(
            (expected_token != UNCHECKED_TOKEN) & (rec[:, TOKEN] != expected_token),
            int(FailBits.VERIFY_TOKEN),
            0,
        )
    )
    hit = (bits != 0).nonzero().squeeze(1)
    tag = torch.full_like(slots, args.launch_tag)
    columns = (
        tag,
        slots,
        rec[:, POSITION],
        rec[:, TOKEN],
        expected_token,
        rec[:, PREV_HASH],
        expected_chain,
        bits,
    )
    rows = torch.stack([c.index_select(0, hit).to(RECORD_DTYPE) for c in columns], dim=1)
    # The context of the appended rows only: the entry's request (its row, by the
    # contract's bisection), the position it expected, the slot's last writer.
    hit_slots = slots.index_select(0, hit)
    context = torch.stack(
        [
            request_of_entries(buffers, looked.index_select(0, hit)),
            positions.index_select(0, hit),
            store.owners.index_select(0, hit_slots),
        ],
        dim=1,
    )
    append_rows(store, rows, context)
    store.kernel_runs.add_(1)
    store.slots_processed.add_(n)


def verify_reference(
    store: CanaryStore, plan_buffers: PlanBuffers, **inputs: Unpack[VerifyInputs]
) -> None:
    """Check the records of every verify entry of a plan, exactly per
    docs/contract-canary.md ("Verify"), appending a violation row for each entry that
    disagrees.

    Args:
        store: the :class:`CanaryStore` of the KV pool.
        plan_buffers: a :class:`PlanBuffers` filled by a plan (its verify entries,
            ``verify_num_valid`` and ``verify_enable``; a plan with ``verify_enable = 0``,
            overflowed or write-only, checks nothing and counts ``store.verify_skipped``;
            and, for a failing entry's context, ``verify_offsets``,
            ``row_req_pool_indices`` and ``write_num_valid_reqs``).
        **inputs: :class:`VerifyInputs` (``launch_tag``, ``check_expected_tokens``,
            ``real_kv``).

    Raises:
        TypeError: ``store``/``plan_buffers`` of the wrong type, or an argument of the
            wrong type.
        ValueError: a host-side check failed, or an entry's slot or predecessor lies
            outside the store (the message names the entry and the value). Nothing is
            written then.
    """
    args = validate_verify_args(store, plan_buffers, **inputs)
    store.check(views=True)  # torch reads and writes through the views themselves
    plan_buffers.check(views=True)
    _verify(store, plan_buffers, args)
