"""Host-side checks of one plan call: the one module both plan paths run first.

Everything that can be known without reading tensor data is checked here, before either
path writes a byte: the buffers object, each tensor's dtype, rank, contiguity and device,
per-row lengths, ``bs`` against the capacity, the window, the LUT and the token pool.
Nothing is cast or copied to make an input fit (a cast allocates, and an allocation breaks
graph replay). Every message starts with ``kv-canary:`` and names the argument, what was
expected and what was given.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NoReturn

import torch

from .arena import Arena
from .buffers import STAGING_LINK_ATTR, PlanBuffers, StagingLink
from .checks import (
    check_bool,
    check_int64,
    check_length,
    check_row_tensor,
    check_tensor,
)
from .layout import (
    INT64_MAX,
    INT64_MIN,
    LUT_DTYPE,
    PLAN_FIELDS,
    REQ_TO_TOKEN_DTYPE,
    ROW_DTYPE,
    TOKEN_POOL_DTYPE,
)
from .real_kv import RealKV
from .store import CanaryStore


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
    full_to_swa_index_mapping: torch.Tensor | None
    req_to_verify_expected_tokens: torch.Tensor | None
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None
    kv_token_id_vs_position_offset: int
    addresses: tuple[int | None, ...]
    """The data pointers of the seven tensor inputs above, in that order (None for an
    input not given), read once by the checks: the kernels' launch passes them instead
    of the tensors."""


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
            which = (
                "PlanBuffers that no longer exist"
                if built_for is None
                else f"other PlanBuffers (generation {link.generation})"
            )
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
    req_to_token: torch.Tensor,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None = None,
    kv_token_id_vs_position_offset: int = 0,
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
    if not (
        type(table) is T
        and table.dtype is REQ_TO_TOKEN_DTYPE
        and table.dim() == 2
        and on(table)
        and table.is_contiguous()
    ):
        check_tensor("req_to_token", table, REQ_TO_TOKEN_DTYPE, 2, device, on)
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

    # No input may share memory with the arena (the plan would overwrite what it still
    # reads): one range test per input (all are contiguous), named on the slow path.
    # Staging tensors carry the PlanBuffers they were built for: refuse other buffers.
    # The row tensors were just checked int64 [bs] and contiguous: 8 * bs bytes each.
    start = arena.base
    end = start + arena.nbytes
    row_bytes = 8 * bs
    inputs = (rp, P, E, table, lut, pool, valid_lens)
    addresses = (
        rp.data_ptr(),
        P.data_ptr(),
        E.data_ptr(),
        table.data_ptr(),
        None if lut is None else lut.data_ptr(),
        None if pool is None else pool.data_ptr(),
        None if valid_lens is None else valid_lens.data_ptr(),
    )
    linked = False
    for i in (0, 1, 2, 6):
        ptr = addresses[i]
        if ptr is not None:
            if ptr < end and ptr + row_bytes > start:
                _refuse_shared_memory(arena, _named_inputs(*inputs))
            if getattr(inputs[i], STAGING_LINK_ATTR, None) is not None:  # linked staging
                linked = True
    for i in (3, 4, 5):
        ptr = addresses[i]
        if ptr is not None and ptr < end and ptr + inputs[i].nbytes > start:  # type: ignore[union-attr]
            _refuse_shared_memory(arena, _named_inputs(*inputs))
    if linked:  # after every aliasing test
        _refuse_foreign_staging(bufs, _named_inputs(*inputs))
    return _new_tuple(
        PlanArgs, (bs, rp, P, E, table, window, lut, pool, valid_lens, offset, addresses)
    )


_new_tuple = tuple.__new__


def _named_inputs(*tensors: object) -> tuple[tuple[str, object], ...]:
    return tuple(zip(_INPUT_NAMES, tensors))


_WRITE_ROWS = [f.name for f in PLAN_FIELDS].index("write_seed_slot_indices")
"""The arena field whose length is ``write_req_capacity``."""

_INPUT_NAMES = (
    "req_pool_indices",
    "prefix_lens",
    "extend_seq_lens",
    "req_to_token",
    "full_to_swa_index_mapping",
    "req_to_verify_expected_tokens",
    "req_to_verify_expected_tokens_valid_lens",
)


# --- write and verify (docs/contract.md, "Write" and "Verify") -----------------------
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


class VerifyArgs(NamedTuple):
    """The validated arguments of one verify call."""

    launch_tag: int
    check_expected_tokens: bool
    real_kv: RealKV | None


def check_store(store: object) -> CanaryStore:
    """Accept only the library's own :class:`CanaryStore` (exact type), re-checked."""
    if type(store) is not CanaryStore:
        raise TypeError(
            "kv-canary: store must be a kv_canary_buffers.CanaryStore (build one with "
            f"CanaryStore.allocate), got {type(store).__name__}"
        )
    store.check()
    return store


def check_plan_buffers(buffers: object) -> PlanBuffers:
    """Accept only the library's own :class:`PlanBuffers` (exact type), re-checked."""
    if type(buffers) is not PlanBuffers:
        raise TypeError(
            "kv-canary: plan_buffers must be a kv_canary_buffers.PlanBuffers (build one with "
            f"PlanBuffers.allocate), got {type(buffers).__name__}"
        )
    buffers.check()
    return buffers


def _check_not_aliasing_store(name: str, t: torch.Tensor, store: CanaryStore) -> None:
    if store.arena.overlaps(t):
        raise ValueError(
            f"kv-canary: {name} must not share memory with the CanaryStore it writes, got a "
            "tensor inside the store's arena (pass the engine's own tensors)"
        )


def _check_real_kv(real_kv: object, store: CanaryStore) -> RealKV | None:
    if real_kv is None:
        return None
    if type(real_kv) is not RealKV:
        raise TypeError(
            "kv-canary: real_kv must be a kv_canary_buffers.RealKV or None, "
            f"got {type(real_kv).__name__}"
        )
    real_kv.check()
    if real_kv.hashed_bytes == 0:
        return None
    arena = store.arena
    if not arena.on_device(real_kv.sources[0]):  # real_kv.device != store's
        raise ValueError(
            f"kv-canary: real_kv sources must be on the store's device {store.device}, "
            f"got {real_kv.device}"
        )
    # The sources' byte spans were computed at construction: check() just proved each
    # source still has the address, shape, strides and dtype they were computed from.
    start = arena.base
    end = start + arena.nbytes
    for lo, hi in real_kv._spans:
        if lo < hi and lo < end and start < hi:
            for i, src in enumerate(real_kv.sources):
                _check_not_aliasing_store(f"real_kv.sources[{i}]", src, store)
    return real_kv


def _check_same_device(store: CanaryStore, buffers: PlanBuffers) -> None:
    if store.device != buffers.device:
        raise ValueError(
            f"kv-canary: plan_buffers must be on the store's device {store.device}, "
            f"got {buffers.device}"
        )


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
    # check_store / check_plan_buffers / _check_same_device, their common case inline
    if type(store) is not CanaryStore:
        check_store(store)  # raises the TypeError
    st: CanaryStore = store  # type: ignore[assignment]
    st.check()
    if type(plan_buffers) is not PlanBuffers:
        check_plan_buffers(plan_buffers)  # raises the TypeError
    bufs: PlanBuffers = plan_buffers  # type: ignore[assignment]
    bufs.check()
    if st.arena.device != bufs.arena.device:
        _check_same_device(st, bufs)
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
    kv = None if real_kv is None else _check_real_kv(real_kv, st)
    return _new_tuple(
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
        _check_not_aliasing_store(name, t, store)
    raise AssertionError("kv-canary: internal error: the fast input check failed alone")


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
        _check_same_device(st, bufs)
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
    kv = None if real_kv is None else _check_real_kv(real_kv, st)
    return _new_tuple(VerifyArgs, (tag, check, kv))
