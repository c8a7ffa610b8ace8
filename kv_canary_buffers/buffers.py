"""``PlanBuffers``: the one owner of every tensor the plan writes.

An engine builds one per KV pool (buffer group), keeps it alive from the plan to the last
kernel that reads the plan, and passes it to :func:`kv_canary_buffers.plan_reference` or
:func:`kv_canary_kernels.launch_plan`. Every tensor is a fixed view into one zeroed device
allocation (the arena, :mod:`kv_canary_buffers.arena`) laid out from the two capacities by
:data:`kv_canary_buffers.layout.PLAN_FIELDS`, so an offsets buffer of
``write_req_capacity`` elements cannot exist and two fields cannot share memory.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import attrs
import torch

from .arena import (
    Arena,
    ArenaField,
    FieldAlias,
    check_owned_arena,
    check_private_views,
    layout,
)
from .checks import check_capacity, check_need, nonnegative_field
from .devices import DeviceLike, normalize_device
from .layout import MAX_CAPACITY, PLAN_FIELDS, plan_specs
from .layout_docs import docstring_with_fields
from .status import PlanStatus

_FIELD_NAMES = tuple(f.name for f in PLAN_FIELDS)
_SYNC_FIELDS = tuple(f.name for f in PLAN_FIELDS if f.role == "sync")
_get_fields = operator.attrgetter(*("_" + n for n in _FIELD_NAMES))  # the private views
_GETTERS: dict[tuple[str, ...], Any] = {}
_SEEDS = _FIELD_NAMES.index("write_seed_slot_indices")  # [write_req_capacity]
_SLOTS = _FIELD_NAMES.index("verify_slot_indices")  # [verify_capacity]
_ALL_STATUS = int(sum(PlanStatus))

OFFSETS_MSG = "kv-canary: write_offsets_len must equal write_req_capacity + 1, got {} and {}"
"""SGLang's launch-time message, kept word for word: here it can only come from a field
that was replaced or resized behind the buffers' back."""


@functools.lru_cache(maxsize=64)
def _layout(write_req_capacity: int, verify_capacity: int) -> tuple[tuple[ArenaField, ...], int]:
    """The arena's fields and total bytes for these capacities."""
    return layout(plan_specs(write_req_capacity, verify_capacity))


@attrs.frozen(kw_only=True, eq=False, repr=False)
class PlanBuffers:
    """Every output and scratch tensor of one plan: views into one arena, sized by
    construction.

    Build it with :meth:`allocate`; grow it with :meth:`resize` or :meth:`ensure_capacity`.
    Each field is a :class:`~kv_canary_buffers.arena.FieldAlias`: a read returns a new
    alias of the buffers' own view (assignment and deletion refused), so nothing done to a
    tensor a caller holds reaches the buffers; the capacities and the device are read from
    the arena, and :meth:`check` (run at every launch) proves the arena intact and owned.
    With ``Cw = write_req_capacity`` and ``Cv = verify_capacity`` (the table is
    :data:`~kv_canary_buffers.layout.PLAN_FIELDS`, rendered at import):

    {fields}

    Verify entries at and after ``verify_num_valid`` are unspecified.

    One owner per arena: ``copy.copy`` and ``attrs.evolve`` (which would make a second
    object writing the same memory) are refused; ``copy.deepcopy`` and pickling make a new
    arena holding a copy of every byte, with the same generation and its own identity.
    """

    arena: Arena = attrs.field(repr=False)
    generation: int = attrs.field(default=0, validator=nonnegative_field)

    _write_offsets: torch.Tensor = attrs.field(repr=False)
    _write_seed_slot_indices: torch.Tensor = attrs.field(repr=False)
    _write_num_valid_reqs: torch.Tensor = attrs.field(repr=False)
    _row_req_pool_indices: torch.Tensor = attrs.field(repr=False)
    _verify_slot_indices: torch.Tensor = attrs.field(repr=False)
    _verify_expected_tokens: torch.Tensor = attrs.field(repr=False)
    _verify_expected_positions: torch.Tensor = attrs.field(repr=False)
    _verify_prev_slot_indices: torch.Tensor = attrs.field(repr=False)
    _verify_num_valid: torch.Tensor = attrs.field(repr=False)
    _verify_enable: torch.Tensor = attrs.field(repr=False)
    _verify_offsets: torch.Tensor = attrs.field(repr=False)
    _scan_block_sums: torch.Tensor = attrs.field(repr=False)
    _verify_row_hints: torch.Tensor = attrs.field(repr=False)
    _launch_sync: torch.Tensor = attrs.field(repr=False)
    _scan_chunk_sums: torch.Tensor = attrs.field(repr=False)
    _status: torch.Tensor = attrs.field(repr=False)
    _dummy_int64: torch.Tensor = attrs.field(repr=False)
    _dummy_int32: torch.Tensor = attrs.field(repr=False)

    # The public fields: each read is a new alias of the private view above.
    write_offsets = FieldAlias()
    write_seed_slot_indices = FieldAlias()
    write_num_valid_reqs = FieldAlias()
    row_req_pool_indices = FieldAlias()
    verify_slot_indices = FieldAlias()
    verify_expected_tokens = FieldAlias()
    verify_expected_positions = FieldAlias()
    verify_prev_slot_indices = FieldAlias()
    verify_num_valid = FieldAlias()
    verify_enable = FieldAlias()
    verify_offsets = FieldAlias()
    scan_block_sums = FieldAlias()
    verify_row_hints = FieldAlias()
    launch_sync = FieldAlias()
    scan_chunk_sums = FieldAlias()
    status = FieldAlias()
    dummy_int64 = FieldAlias()
    dummy_int32 = FieldAlias()

    def __attrs_post_init__(self) -> None:
        _check_arena_layout(self.arena, "PlanBuffers", _FIELD_NAMES, _plan_layout_of)
        self._check_views()
        self.arena.claim(self, "PlanBuffers")

    # --- construction -------------------------------------------------------------
    @classmethod
    def allocate(
        cls, *, write_req_capacity: int, verify_capacity: int, device: DeviceLike
    ) -> PlanBuffers:
        """Allocate zeroed buffers for up to ``write_req_capacity`` rows per plan and up
        to ``verify_capacity`` verify entries, on ``device``. Generation 0.

        Raises ``TypeError`` for a non-integer and ``ValueError`` for a capacity outside
        ``[1, 2**31 - 1]``.
        """
        return cls._allocate(write_req_capacity, verify_capacity, device, generation=0)

    @classmethod
    def _allocate(
        cls,
        write_req_capacity: object,
        verify_capacity: object,
        device: DeviceLike,
        generation: int,
    ) -> PlanBuffers:
        w = check_capacity("write_req_capacity", write_req_capacity)
        v = check_capacity("verify_capacity", verify_capacity)
        fields, nbytes = _layout(w, v)
        arena, views = Arena.allocate(fields, nbytes, normalize_device(device))
        return cls(arena=arena, generation=generation, **views)

    @staticmethod
    def allocation_bytes(write_req_capacity: int, verify_capacity: int) -> int:
        """Device bytes :meth:`allocate` takes for these capacities (equal to the result's
        :attr:`nbytes`), so an engine can budget memory before it allocates."""
        w = check_capacity("write_req_capacity", write_req_capacity)
        v = check_capacity("verify_capacity", verify_capacity)
        return _layout(w, v)[1]

    # --- read from the arena ------------------------------------------------------
    @property
    def write_req_capacity(self) -> int:
        """Rows a plan may have (``write_seed_slot_indices.shape[0]``)."""
        try:
            return self.arena.fields[_SEEDS].shape[0]
        except (AttributeError, IndexError, TypeError):
            self.check(views=True)  # raises the kv-canary error of the tampering
            raise

    @property
    def verify_capacity(self) -> int:
        """Verify entries a plan may have (``verify_slot_indices.shape[0]``)."""
        try:
            return self.arena.fields[_SLOTS].shape[0]
        except (AttributeError, IndexError, TypeError):
            self.check(views=True)
            raise

    @property
    def device(self) -> torch.device:
        """Where every tensor lives (``"cuda"`` is pinned to the current index)."""
        try:
            return self.arena.device
        except AttributeError:
            self.check(views=True)
            raise

    @property
    def nbytes(self) -> int:
        """Device bytes of the arena: every field, each aligned to 256 bytes."""
        self.check(views=True)
        return self.arena.nbytes

    def __repr__(self) -> str:
        try:
            return (
                f"PlanBuffers(write_req_capacity={self.write_req_capacity}, "
                f"verify_capacity={self.verify_capacity}, device={self.device!r}, "
                f"generation={self.generation!r})"
            )
        except Exception:  # a tampered object must still print
            return "PlanBuffers(<tampered>)"

    # --- growth -------------------------------------------------------------------
    def resize(
        self, *, write_req_capacity: int | None = None, verify_capacity: int | None = None
    ) -> PlanBuffers:
        """Return new, zeroed buffers with the given capacities (an omitted one is kept)
        and ``generation + 1``. ``self`` is left untouched and stays valid.

        The new tensors live at new addresses: a CUDA graph captured on an older
        generation still reads and writes the old tensors and must be re-captured, and
        staging built with ``GraphInputs.for_buffers(old)`` is refused with the new
        buffers (build it again).
        """
        self.check(views=True)
        return PlanBuffers._allocate(
            self.write_req_capacity if write_req_capacity is None else write_req_capacity,
            self.verify_capacity if verify_capacity is None else verify_capacity,
            self.device,
            generation=self._generation() + 1,
        )

    def ensure_capacity(self, *, write_reqs: int = 0, verify_entries: int = 0) -> PlanBuffers:
        """Grow-only helper: return ``self`` when ``write_reqs`` rows and
        ``verify_entries`` entries fit, otherwise :meth:`resize` with headroom.

        Growth policy: a capacity that is too small becomes
        ``min(max(needed, 2 * current), 2**31 - 1)``; one that fits is kept. Doubling keeps
        the number of resizes (and graph re-captures) logarithmic in the growth, at most
        twice the memory the largest step needed. Capacities never shrink. A need past
        ``2**31 - 1`` raises ``ValueError`` (no capacity can hold it).
        """
        rows = check_need("write_reqs", write_reqs)
        entries = check_need("verify_entries", verify_entries)
        self.check()
        if rows <= self.write_req_capacity and entries <= self.verify_capacity:
            return self

        def grown(current: int, needed: int) -> int | None:
            if needed <= current:
                return None
            return min(max(needed, 2 * current), MAX_CAPACITY)

        return self.resize(
            write_req_capacity=grown(self.write_req_capacity, rows),
            verify_capacity=grown(self.verify_capacity, entries),
        )

    def _generation(self) -> int:
        generation = self.generation
        if type(generation) is not int or generation < 0:
            raise TypeError(
                f"kv-canary: PlanBuffers.generation must be an int >= 0, got "
                f"{type(generation).__name__} {generation!r} (the object was tampered with)"
            )
        return generation

    # --- copies -------------------------------------------------------------------
    def __copy__(self) -> PlanBuffers:
        raise TypeError(
            "kv-canary: a PlanBuffers cannot be shallow-copied (two owners of one arena "
            "would write the same memory); use copy.deepcopy for an independent copy, or "
            "resize() for a larger one"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> PlanBuffers:
        self.check(views=True)
        new = PlanBuffers._allocate(
            self.write_req_capacity, self.verify_capacity, self.device, self._generation()
        )
        new.arena.byte_view().copy_(self.arena.byte_view())
        new._clear_sync()
        memo[id(self)] = new
        return new

    def _clear_sync(self) -> None:
        """Zero the words the one-launch plan's programs wait on (layout role ``sync``): a
        copy numbers its launches from 1 again (``Arena.launches``), so it must not keep
        its original's marks and counters."""
        for name in _SYNC_FIELDS:
            getattr(self, name).zero_()

    def __reduce__(self) -> Any:
        self.check(views=True)
        return (
            _unpickle_plan_buffers,
            (
                self.write_req_capacity,
                self.verify_capacity,
                str(self.device),
                self._generation(),
                self.arena.byte_view().cpu(),
            ),
        )

    # --- checks -------------------------------------------------------------------
    def check(self, *, views: bool = False) -> None:
        """Re-check that the arena is intact and this object owns it: the arena is an
        :class:`~kv_canary_buffers.arena.Arena`, its storage is still at its allocation
        address with its size (a storage resized or freed through any alias of a field),
        this object is the one that claimed it, and the first private view still starts at
        the address the arena had at construction (so neither a rebound ``arena`` nor a
        rebound ``Arena.base``, ``nbytes`` or ``storage`` passes). Reads no data and never
        syncs; both plan paths, the write and the verify run it at every launch.

        That is all a launch needs: the public fields are :class:`FieldAlias` reads (a new
        alias of a private view at each read, assignment refused), so nothing done to a
        tensor a caller holds changes the memory the launches address. ``views=True`` also
        re-checks every private view (data pointer at the field's offset, dtype, shape,
        contiguity), for the paths that hand them to torch or to Triton as tensors: the
        torch references, a launch not repeated from the launchers' cache (the first of a
        variant, every launch under the interpreter), and the methods that read, write or
        copy through them."""
        check_owned_arena(self, "_write_offsets")
        if views:
            self._check(_FIELD_NAMES, _get_fields)

    def check_fields(self, names: tuple[str, ...]) -> None:
        """:meth:`check` with the private views of the fields ``names`` only (``names``: a
        tuple of field names, in any order)."""
        getter = _GETTERS.get(names) if type(names) is tuple else None
        if getter is None:
            _check_field_names(names)
            getter = _GETTERS[names] = operator.attrgetter(*("_" + n for n in names))
        self.check()
        self._check(names, getter)

    def _check(self, names: tuple[str, ...], getter: Any) -> None:
        check_private_views(
            self,
            getter,
            "build buffers with PlanBuffers.allocate and never delete their attributes",
            None if names is _FIELD_NAMES else names,
        )

    def _check_views(self) -> None:
        """The private views only (the constructor claims the arena after it)."""
        self._check(_FIELD_NAMES, _get_fields)

    def _raise_bad_field(self, name: str) -> NoReturn:
        arena = self.arena
        if name == "<arena>":
            raise ValueError(
                f"kv-canary: the PlanBuffers arena's storage was resized or replaced (it must "
                f"hold {arena.nbytes} bytes at its allocation address, got "
                f"{arena.storage.nbytes()} bytes); never resize a field's storage"
            )
        index = _FIELD_NAMES.index(name)
        t = getattr(self, "_" + name, None)
        spec = arena.fields[index]
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"kv-canary: PlanBuffers.{name} must be a torch.Tensor, got {type(t).__name__}"
            )
        w, v = arena.fields[_SEEDS].shape[0], arena.fields[_SLOTS].shape[0]
        if tuple(t.shape) != spec.shape:
            if name == "write_offsets":
                got = t.shape[0] if t.dim() == 1 else t.numel()
                raise ValueError(OFFSETS_MSG.format(got, w))
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must have shape {spec.shape} for "
                f"write_req_capacity={w}, verify_capacity={v}, got {tuple(t.shape)}"
            )
        if t.dtype != spec.dtype:
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must have dtype {spec.dtype}, got {t.dtype}"
            )
        if t.device != arena.device:
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must be on device {arena.device} "
                f"(PlanBuffers.device), got {t.device}"
            )
        if not t.is_contiguous():
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must be contiguous, got strides {t.stride()}"
            )
        raise ValueError(
            f"kv-canary: PlanBuffers.{name} is not the memory it was built with (its private "
            "view was rebound, swapped with .data or set_(), or made to share memory with "
            "another field; or the object was built with views of other memory); build "
            "buffers with PlanBuffers.allocate and change them only through resize()"
        )

    # --- status -------------------------------------------------------------------
    def take_status(self) -> PlanStatus:
        """Return the sticky :class:`PlanStatus` flags raised since the last call and
        clear them. Reads device memory: this synchronizes with the current stream, so
        call it between steps (for example every N steps), never inside graph capture."""
        self.check(views=True)
        flags = PlanStatus(int(self.status.item()) & _ALL_STATUS)
        self.status.zero_()
        return flags


PlanBuffers.__doc__ = docstring_with_fields(
    PlanBuffers.__doc__, PLAN_FIELDS, "after a plan of `bs` rows"
)


def _check_field_names(names: object) -> None:
    """``names`` of :meth:`PlanBuffers.check_fields`: a non-empty tuple of field names."""
    if type(names) is not tuple or not all(type(n) is str for n in names):
        raise TypeError(
            "kv-canary: names must be a tuple of PlanBuffers field names, got "
            f"{type(names).__name__} {names!r}"
        )
    unknown = [n for n in names if n not in _FIELD_NAMES]
    if not names or unknown:
        raise ValueError(
            f"kv-canary: names must be PlanBuffers field names ({', '.join(_FIELD_NAMES)}), "
            f"got {unknown[0] if unknown else 'an empty tuple'!r}"
        )


def _plan_layout_of(arena: Arena) -> tuple[tuple[ArenaField, ...], int]:
    w = check_capacity("write_req_capacity", arena.fields[_SEEDS].shape[0])
    v = check_capacity("verify_capacity", arena.fields[_SLOTS].shape[0])
    return _layout(w, v)


def _check_arena_layout(
    arena: object,
    kind: str,
    names: tuple[str, ...],
    layout_of: Callable[[Arena], tuple[tuple[ArenaField, ...], int]],
) -> None:
    """At construction: ``arena`` is an :class:`Arena` laid out exactly as ``kind``'s
    layout table lays out its capacities, and its storage is on its device."""
    if type(arena) is not Arena:
        raise TypeError(
            f"kv-canary: {kind}.arena must be a kv_canary_buffers.arena.Arena; build one with "
            f"{kind}.allocate, got {type(arena).__name__}"
        )
    if (
        tuple(f.name for f in arena.fields) != names
        or layout_of(arena) != (arena.fields, arena.nbytes)
        or arena.storage.device != arena.device
    ):
        raise ValueError(
            f"kv-canary: {kind}.arena must have the {kind} layout of its capacities; build "
            f"one with {kind}.allocate"
        )


def _unpickle_plan_buffers(
    write_req_capacity: int,
    verify_capacity: int,
    device: str,
    generation: int,
    state: torch.Tensor,
) -> PlanBuffers:
    buffers = PlanBuffers._allocate(write_req_capacity, verify_capacity, device, generation)
    buffers.arena.byte_view().copy_(state)
    buffers._clear_sync()
    return buffers


# --- the link from staging tensors to the buffers they were built for ----------------
STAGING_LINK_ATTR = "_kv_canary_staging_link"
"""Attribute set on each tensor of a ``GraphInputs.for_buffers(buffers)``: its
:class:`StagingLink`. The plan's validation reads it (one ``getattr``) to refuse staging
built for other buffers."""


@attrs.frozen(eq=False)
class StagingLink:
    """Which :class:`PlanBuffers` (a weak reference: staging never keeps buffers alive)
    and generation a ``GraphInputs`` was built for."""

    buffers: Callable[[], PlanBuffers | None]
    generation: int

    @classmethod
    def to(cls, buffers: PlanBuffers) -> StagingLink:
        return cls(weakref.ref(buffers), buffers._generation())

    def __reduce__(self) -> Any:
        # A pickled or copied *tensor* is an ordinary tensor: the link does not follow it
        # (GraphInputs pickles and copies its own link).
        return (_no_link, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None


def _no_link() -> None:
    return None
