"""``CanaryStore``: the one owner of a KV pool's canary records and violation ring.

An engine builds one per KV pool (and per endpoint it checks, for example a HEAD store
verified before the forward and a TAIL store after it, see docs/user-guide.md), grows it
with :meth:`CanaryStore.resize` when the pool grows, and passes it with a
:class:`PlanBuffers` to the write and verify stages (``write_reference`` /
``verify_reference`` on the CPU, ``kv_canary_kernels.launch_write`` /
``launch_verify`` on a GPU). Every tensor is a fixed view into one zeroed allocation (the
arena), sized from ``num_slots`` and ``violation_capacity`` by construction.
"""

from __future__ import annotations

import operator
import os
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
    raise_moved_view,
)
from .checks import check_capacity, check_need, nonnegative_field
from .devices import DeviceLike, normalize_device
from .layout import STORE_FIELDS, store_specs
from .layout_docs import docstring_with_fields
from .report import Violation, ViolationReport
from .status import CanaryStatus

_FIELD_NAMES = tuple(f.name for f in STORE_FIELDS)
_get_fields = operator.attrgetter(*("_" + n for n in _FIELD_NAMES))  # the private views


def _layout(num_slots: int, violation_capacity: int) -> tuple[tuple[ArenaField, ...], int]:
    return layout(store_specs(num_slots, violation_capacity))


@attrs.frozen(kw_only=True, eq=False, repr=False)
class CanaryStore:
    """Every tensor of one record store, views into one arena, zeroed at allocation.

    Build it with :meth:`allocate`; grow it with :meth:`resize` / :meth:`ensure_capacity`.
    Each field is a :class:`~kv_canary_buffers.arena.FieldAlias` (a new alias of the
    store's own view at each read; assignment and deletion refused). With
    ``N = num_slots`` and ``V = violation_capacity`` (the table is
    :data:`~kv_canary_buffers.layout.STORE_FIELDS`, rendered at import):

    {fields}

    A store has exactly one owner of its arena: ``copy.copy`` and ``attrs.evolve`` that
    would make a second one are refused; ``copy.deepcopy`` and pickling make a new arena.
    """

    arena: Arena = attrs.field(repr=False)
    generation: int = attrs.field(default=0, validator=nonnegative_field)

    _records: torch.Tensor = attrs.field(repr=False)
    _violations: torch.Tensor = attrs.field(repr=False)
    _violation_count: torch.Tensor = attrs.field(repr=False)
    _kernel_runs: torch.Tensor = attrs.field(repr=False)
    _slots_processed: torch.Tensor = attrs.field(repr=False)
    _chain_position_check: torch.Tensor = attrs.field(repr=False)
    _status: torch.Tensor = attrs.field(repr=False)
    _owners: torch.Tensor = attrs.field(repr=False)
    _violation_context: torch.Tensor = attrs.field(repr=False)
    _verify_skipped: torch.Tensor = attrs.field(repr=False)

    # The public fields: each read is a new alias of the private view above.
    records = FieldAlias()
    violations = FieldAlias()
    violation_count = FieldAlias()
    kernel_runs = FieldAlias()
    slots_processed = FieldAlias()
    chain_position_check = FieldAlias()
    status = FieldAlias()
    owners = FieldAlias()
    violation_context = FieldAlias()
    verify_skipped = FieldAlias()

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.arena, Arena):
            raise TypeError(
                "kv-canary: CanaryStore.arena must be an Arena; build a store with "
                f"CanaryStore.allocate, got {type(self.arena).__name__}"
            )
        if tuple(f.name for f in self.arena.fields) != _FIELD_NAMES:
            raise ValueError("kv-canary: CanaryStore.arena must have a CanaryStore layout")
        self._check_views()
        self.arena.claim(self, "CanaryStore")

    def __repr__(self) -> str:
        try:
            return (
                f"CanaryStore(num_slots={self.num_slots}, "
                f"violation_capacity={self.violation_capacity}, device={self.device!r}, "
                f"generation={self.generation!r})"
            )
        except Exception:  # a tampered object must still print
            return "CanaryStore(<tampered>)"

    # --- construction -------------------------------------------------------------
    @classmethod
    def allocate(
        cls, *, num_slots: int, violation_capacity: int, device: DeviceLike
    ) -> CanaryStore:
        """A zeroed store for a KV pool of ``num_slots`` slots (slot 0 is the pool's
        padding slot) and a ring of ``violation_capacity`` rows, on ``device``.

        Raises ``TypeError`` for a non-integer and ``ValueError`` for a size outside
        ``[1, 2**31 - 1]``.
        """
        return cls._allocate(num_slots, violation_capacity, device, generation=0)

    @classmethod
    def _allocate(
        cls, num_slots: object, violation_capacity: object, device: DeviceLike, generation: int
    ) -> CanaryStore:
        n = check_capacity("num_slots", num_slots)
        v = check_capacity("violation_capacity", violation_capacity)
        fields, nbytes = _layout(n, v)
        arena, views = Arena.allocate(fields, nbytes, normalize_device(device))
        return cls(arena=arena, generation=generation, **views)

    @staticmethod
    def allocation_bytes(num_slots: int, violation_capacity: int) -> int:
        """Device bytes :meth:`allocate` takes for these sizes (equal to its
        :attr:`nbytes`): 40 per slot (the record and its owner), 88 per ring row (the row
        and its context), plus alignment."""
        n = check_capacity("num_slots", num_slots)
        v = check_capacity("violation_capacity", violation_capacity)
        return _layout(n, v)[1]

    @property
    def num_slots(self) -> int:
        """Slots of the KV pool this store covers (``records.shape[0]``)."""
        return self.arena.fields[0].shape[0]

    @property
    def violation_capacity(self) -> int:
        """Rows the violation ring keeps (``violations.shape[0]``)."""
        return self.arena.fields[1].shape[0]

    @property
    def device(self) -> torch.device:
        """Where every tensor lives."""
        return self.arena.device

    @property
    def nbytes(self) -> int:
        """Device bytes of the arena."""
        return self.arena.nbytes

    # --- growth -------------------------------------------------------------------
    def resize(
        self, *, num_slots: int | None = None, violation_capacity: int | None = None
    ) -> CanaryStore:
        """A new store (``generation + 1``) with the given sizes (an omitted one is
        kept) holding this store's state: the first ``min(old, new)`` records (with their
        owners) and ring rows (with their context), the count, the counters, the flag and
        the status. ``self`` stays valid and
        unchanged. A grown pool keeps every old slot's record, so its requests verify
        cleanly; the copy runs on the current stream (no sync). Graphs captured on the
        old store must be re-captured (its tensors live at new addresses)."""
        self.check(views=True)  # first: the sizes and device below come from the arena
        new = CanaryStore._allocate(
            self.num_slots if num_slots is None else num_slots,
            self.violation_capacity if violation_capacity is None else violation_capacity,
            self.device,
            self.generation + 1,
        )
        new._copy_state_from(self)
        return new

    def ensure_capacity(self, *, num_slots: int = 0) -> CanaryStore:
        """``self`` when it covers ``num_slots`` slots, else :meth:`resize` to exactly
        ``num_slots`` (a KV pool grows in large, known steps; records cost 32 bytes a
        slot, so no headroom is added)."""
        needed = check_need("num_slots", num_slots)
        self.check()
        if needed <= self.num_slots:
            return self
        return self.resize(num_slots=needed)

    def _copy_state_from(self, old: CanaryStore) -> None:
        # Every field's leading rows that both stores hold: per slot (records, owners),
        # per ring row (violations, violation_context) or the whole of a one-word field.
        for name in _FIELD_NAMES:
            new_field, old_field = getattr(self, name), getattr(old, name)
            rows = min(new_field.shape[0], old_field.shape[0])
            new_field[:rows].copy_(old_field[:rows])

    # --- copies ---------------------------------------------------------------------
    def __copy__(self) -> CanaryStore:
        raise TypeError(
            "kv-canary: a CanaryStore cannot be shallow-copied (two owners of one arena); "
            "use copy.deepcopy for an independent store, or resize() to grow it"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> CanaryStore:
        self.check(views=True)
        new = CanaryStore._allocate(
            self.num_slots, self.violation_capacity, self.device, self.generation
        )
        new._copy_state_from(self)
        memo[id(self)] = new
        return new

    def __reduce__(self) -> Any:
        state = self._state()
        return (
            _unpickle_store,
            (self.num_slots, self.violation_capacity, str(self.device), self.generation, state),
        )

    def _state(self) -> dict[str, torch.Tensor]:
        """Every field as its own CPU tensor (a copy: views of one arena in several dtypes
        cannot be saved by ``torch.save``, which refuses two types over one storage)."""
        self.check(views=True)
        return {name: getattr(self, name).to("cpu", copy=True) for name in _FIELD_NAMES}

    # --- saving (syncs) ---------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every field of the store to ``path`` (``torch.save`` of a dict of CPU
        tensors and ints, readable with ``torch.load(weights_only=True)``), for a later
        :meth:`load` or ``python -m kv_canary_buffers decode PATH``. Synchronizes (the
        fields are copied to the host); reads only, the ring is not cleared."""
        torch.save(
            {
                "format": _SAVE_FORMAT,
                "version": _SAVE_VERSION,
                "num_slots": self.num_slots,
                "violation_capacity": self.violation_capacity,
                "generation": self.generation,
                "fields": self._state(),
            },
            path,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: DeviceLike) -> CanaryStore:
        """A new store on ``device`` holding what :meth:`save` wrote to ``path``: every
        record, ring row, counter, flag and the status, and its generation. A field the
        file does not hold (a file written before the field existed: version 1 has no
        ``owners``, ``violation_context`` nor ``verify_skipped``) starts zeroed.

        Raises ``ValueError`` (``kv-canary:``) for a file that is not a saved store or
        whose fields do not fit its sizes, and what :meth:`allocate` raises."""
        data = torch.load(path, map_location="cpu", weights_only=True)
        if not (isinstance(data, dict) and data.get("format") == _SAVE_FORMAT):
            raise ValueError(
                f"kv-canary: path must be a file written by CanaryStore.save, got {path!s} "
                f"holding {type(data).__name__}"
                + (f" of format {data.get('format')!r}" if isinstance(data, dict) else "")
            )
        if data.get("version") not in _LOADS_VERSIONS:
            raise ValueError(
                f"kv-canary: {path!s} must be a saved store of version "
                f"{' or '.join(map(str, _LOADS_VERSIONS))}, got version {data.get('version')!r}"
            )
        store = cls._allocate(
            data["num_slots"], data["violation_capacity"], device, data["generation"]
        )
        fields = data["fields"]
        unknown = sorted(set(fields) - set(_FIELD_NAMES))
        if unknown:
            raise ValueError(
                f"kv-canary: {path!s} must hold CanaryStore fields only "
                f"({', '.join(_FIELD_NAMES)}), got {', '.join(unknown)}"
            )
        for name, value in fields.items():
            own = getattr(store, name)
            if not (
                isinstance(value, torch.Tensor)
                and value.dtype == own.dtype
                and value.shape == own.shape
            ):
                raise ValueError(
                    f"kv-canary: {path!s} field {name} must be {own.dtype} "
                    f"{list(own.shape)} for its sizes, got "
                    + (
                        f"{value.dtype} {list(value.shape)}"
                        if isinstance(value, torch.Tensor)
                        else type(value).__name__
                    )
                )
            own.copy_(value)
        return store

    # --- checks ---------------------------------------------------------------------
    def check(self, *, views: bool = False) -> None:
        """Re-check that the arena is intact and this store owns it (as
        :meth:`PlanBuffers.check`: the arena's type, its storage at its address with its
        size, the owner, and the first private view at the arena's construction-time
        address). Reads no data, never syncs; every launch of the write and the verify runs
        it first. ``views=True`` also re-checks the private views behind the
        :class:`~kv_canary_buffers.arena.FieldAlias` fields (address, dtype, shape,
        contiguity): the references, a launch not repeated from the launchers' cache and
        the methods that read, write or copy through the views run that."""
        check_owned_arena(self, "_records")
        if views:
            self._check_views()

    def _check_views(self) -> None:
        """The private views only (the constructor claims the arena after it)."""
        check_private_views(self, _get_fields, "build a store with CanaryStore.allocate")

    @staticmethod
    def _raise_bad_field(bad: str) -> NoReturn:
        raise_moved_view(
            "CanaryStore", "store", bad, cause=", or the store was built with views of other memory"
        )

    # --- device flags ---------------------------------------------------------------
    def enable_chain_position_check(self) -> None:
        """Turn on the write stage's check that each written position follows the
        previous one of its row (from the seed's record). Flips the device flag in place
        on the current stream: a captured graph sees it at its next replay."""
        self.check(views=True)
        self.chain_position_check.fill_(1)

    def disable_chain_position_check(self) -> None:
        """Turn the chain-position check off (in place, graph-safe like enabling)."""
        self.check(views=True)
        self.chain_position_check.fill_(0)

    # --- reading back (syncs) -------------------------------------------------------
    def take_violations(self) -> ViolationReport:
        """Read and decode the violation ring, then clear the ring and its count.

        Each row comes with its context (``violation_context``: the row's request, the
        position it expected, the slot's writer), cleared with it. Synchronizes with the
        current stream: call it between steps on the stream the canary runs on (every N
        steps, say), never inside graph capture. Counters are cumulative and not
        cleared."""
        self.check(views=True)
        appended = int(self.violation_count.item())
        kept = max(0, min(appended, self.violation_capacity))
        rows = self.violations[:kept].tolist()
        contexts = self.violation_context[:kept].tolist()
        report = ViolationReport(
            violations=tuple(
                Violation.from_row(row, context=ctx) for row, ctx in zip(rows, contexts)
            ),
            appended=appended,
            dropped=appended - kept,
            kernel_runs=int(self.kernel_runs.item()),
            slots_processed=int(self.slots_processed.item()),
            verify_skipped=int(self.verify_skipped.item()),
        )
        self.violations[:kept].zero_()
        self.violation_context[:kept].zero_()
        self.violation_count.zero_()
        return report

    def take_status(self) -> CanaryStatus:
        """The sticky :class:`CanaryStatus` bits raised since the last call, then clears
        them. Synchronizes with the current stream."""
        self.check(views=True)
        flags = CanaryStatus(int(self.status.item()) & int(_ALL_STATUS))
        self.status.zero_()
        return flags


CanaryStore.__doc__ = docstring_with_fields(CanaryStore.__doc__, STORE_FIELDS, "contents")
_ALL_STATUS = CanaryStatus(sum(CanaryStatus))
_SAVE_FORMAT = "kv-canary-store"
_SAVE_VERSION = 2
"""What :meth:`CanaryStore.save` writes: a dict with this format name and version, the
sizes, the generation and ``fields`` (one CPU tensor per field, by name). Version 2 added
``owners``, ``violation_context`` and ``verify_skipped``."""
_LOADS_VERSIONS = (1, 2)
"""The versions :meth:`CanaryStore.load` reads (a field a version lacks starts zeroed)."""


def _unpickle_store(
    num_slots: int,
    violation_capacity: int,
    device: str,
    generation: int,
    state: dict[str, torch.Tensor],
) -> CanaryStore:
    store = CanaryStore._allocate(num_slots, violation_capacity, device, generation)
    for name, value in state.items():
        getattr(store, name).copy_(value)
    return store
