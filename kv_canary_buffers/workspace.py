"""``WriteWorkspace``: the one owner of what the split write's chain leaves for its stamp.

The split write runs the write stage in two launches: the *chain*
(``write_chain_reference`` / ``kv_canary_kernels.launch_write_chain``), before the
forward and on a side stream, walks each row's hash chain, runs the checks that need no KV
bytes and appends their violation rows; the *stamp* (``write_stamp_reference`` /
``launch_write_stamp``), after the forward, writes each record from what the chain left
here and the hash of the KV bytes the forward wrote, one lane a token. Together they equal
one ``write_reference`` / ``launch_write`` call (docs/contract-canary.md, "Write, split").

Every tensor is a fixed view into one zeroed allocation (the arena) laid out from two host
numbers by :data:`~kv_canary_buffers.layout.WORKSPACE_FIELDS`: ``token_capacity`` (the
most tokens a step writes: ``len(out_cache_loc)``) and ``slot_capacity`` (at least the
store's ``num_slots``). Grow it with :meth:`WriteWorkspace.ensure_capacity` before the
chain, from those host numbers (no sync).

The workspace also remembers, on the host, the last chain launched on it: which store and
plan buffers (their arenas' identities and generations), its launch number and ``n``. The
stamp refuses a workspace whose chain was for another store, plan or generation, or that
holds no chain not yet stamped; on the device, the chain writes its launch number and a
fill number beside its entries, so that a stamp replayed from a CUDA graph without its
chain stamps nothing and raises ``CanaryStatus.WRITE_CHAIN_STALE``.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple, NoReturn

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
from .buffers import _check_arena_layout
from .checks import check_capacity, check_need, nonnegative_field
from .devices import DeviceLike, normalize_device
from .layout import MAX_CAPACITY, WORKSPACE_FIELDS, workspace_specs
from .layout_docs import docstring_with_fields
from .records import check_store

_FIELD_NAMES = tuple(f.name for f in WORKSPACE_FIELDS)
_get_fields = operator.attrgetter(*("_" + n for n in _FIELD_NAMES))  # the private views
_TOKENS = _FIELD_NAMES.index("entry_owners")  # [token_capacity]
_SLOTS = _FIELD_NAMES.index("last_token")  # [slot_capacity]


def _layout(token_capacity: int, slot_capacity: int) -> tuple[tuple[ArenaField, ...], int]:
    return layout(workspace_specs(token_capacity, slot_capacity))


def _layout_of(arena: Arena) -> tuple[tuple[ArenaField, ...], int]:
    t = check_capacity("token_capacity", arena.fields[_TOKENS].shape[0])
    n = check_capacity("slot_capacity", arena.fields[_SLOTS].shape[0])
    return _layout(t, n)


class ChainFill(NamedTuple):
    """What the host remembers of the last chain launched on a workspace."""

    store: tuple[int, int]
    """The store's arena key (``Arena._key``: its handle and base at construction)."""
    store_generation: int
    plan: tuple[int, int]
    """The plan buffers' arena key."""
    plan_generation: int
    launch: int
    """The chain's launch number (1, 2, ... per workspace), written on the device too."""
    n: int
    """``len(out_cache_loc)`` of the chain: the stamp's tokens."""
    stamped: bool
    """Whether a stamp of this fill was launched (a second one is refused)."""


@attrs.frozen(kw_only=True, eq=False, repr=False)
class WriteWorkspace:
    """The split write's workspace: views into one arena, zeroed at allocation.

    Build it with :meth:`allocate`; grow it with :meth:`ensure_capacity`. Each field is a
    :class:`~kv_canary_buffers.arena.FieldAlias` (a new alias of the workspace's own view at
    each read; assignment and deletion refused). With ``T = token_capacity`` and
    ``N = slot_capacity`` (the table is :data:`~kv_canary_buffers.layout.WORKSPACE_FIELDS`,
    rendered at import):

    {fields}

    One owner per arena: ``copy.copy`` and ``attrs.evolve`` are refused; ``copy.deepcopy``
    and pickling make a new, zeroed workspace of the same sizes and generation (what a
    workspace holds belongs to a step in flight: a copy has no chain to stamp).
    """

    arena: Arena = attrs.field(repr=False)
    generation: int = attrs.field(default=0, validator=nonnegative_field)

    _entries: torch.Tensor = attrs.field(repr=False)
    _entry_owners: torch.Tensor = attrs.field(repr=False)
    _entry_fills: torch.Tensor = attrs.field(repr=False)
    _last_token: torch.Tensor = attrs.field(repr=False)
    _fill: torch.Tensor = attrs.field(repr=False)
    _chain_tickets: torch.Tensor = attrs.field(repr=False)
    _stamp_tickets: torch.Tensor = attrs.field(repr=False)
    _chain_launch: torch.Tensor = attrs.field(repr=False)
    _last_chain: list[ChainFill] = attrs.field(factory=list, init=False, repr=False)
    """The last chain launched on this workspace (empty before the first): host state
    behind the frozen guard, changed only by the split write's validation."""

    entries = FieldAlias()
    entry_owners = FieldAlias()
    entry_fills = FieldAlias()
    last_token = FieldAlias()
    fill = FieldAlias()
    chain_tickets = FieldAlias()
    stamp_tickets = FieldAlias()
    chain_launch = FieldAlias()

    def __attrs_post_init__(self) -> None:
        _check_arena_layout(self.arena, "WriteWorkspace", _FIELD_NAMES, _layout_of)
        self._check_views()
        self.arena.claim(self, "WriteWorkspace")

    def __repr__(self) -> str:
        try:
            return (
                f"WriteWorkspace(token_capacity={self.token_capacity}, "
                f"slot_capacity={self.slot_capacity}, device={self.device!r}, "
                f"generation={self.generation!r})"
            )
        except Exception:  # a tampered object must still print
            return "WriteWorkspace(<tampered>)"

    # --- construction -------------------------------------------------------------
    @classmethod
    def allocate(
        cls, *, token_capacity: int, slot_capacity: int, device: DeviceLike
    ) -> WriteWorkspace:
        """A zeroed workspace for steps of up to ``token_capacity`` written tokens
        (``len(out_cache_loc)``) on stores of up to ``slot_capacity`` slots, on
        ``device``. Generation 0.

        Raises ``TypeError`` for a non-integer and ``ValueError`` for a size outside
        ``[1, 2**31 - 1]``."""
        return cls._allocate(token_capacity, slot_capacity, device, generation=0)

    @classmethod
    def for_store(cls, store: Any, *, token_capacity: int) -> WriteWorkspace:
        """:meth:`allocate` with ``slot_capacity = store.num_slots`` on the store's device."""
        st = check_store(store)
        return cls.allocate(
            token_capacity=token_capacity, slot_capacity=st.num_slots, device=st.device
        )

    @classmethod
    def _allocate(
        cls, token_capacity: object, slot_capacity: object, device: DeviceLike, generation: int
    ) -> WriteWorkspace:
        t = check_capacity("token_capacity", token_capacity)
        n = check_capacity("slot_capacity", slot_capacity)
        fields, nbytes = _layout(t, n)
        arena, views = Arena.allocate(fields, nbytes, normalize_device(device))
        return cls(arena=arena, generation=generation, **views)

    @staticmethod
    def allocation_bytes(token_capacity: int, slot_capacity: int) -> int:
        """Device bytes :meth:`allocate` takes for these sizes (equal to its :attr:`nbytes`):
        48 per token (the entry, its owner and fill), 4 per slot, plus alignment."""
        t = check_capacity("token_capacity", token_capacity)
        n = check_capacity("slot_capacity", slot_capacity)
        return _layout(t, n)[1]

    # --- read from the arena ------------------------------------------------------
    @property
    def token_capacity(self) -> int:
        """Tokens a step may write (``entry_owners.shape[0]``)."""
        return self.arena.fields[_TOKENS].shape[0]

    @property
    def slot_capacity(self) -> int:
        """Slots a store may have (``last_token.shape[0]``)."""
        return self.arena.fields[_SLOTS].shape[0]

    @property
    def device(self) -> torch.device:
        """Where every tensor lives."""
        return self.arena.device

    @property
    def nbytes(self) -> int:
        """Device bytes of the arena."""
        return self.arena.nbytes

    @property
    def last_chain(self) -> ChainFill | None:
        """The last chain launched on this workspace (None before the first)."""
        return self._last_chain[0] if self._last_chain else None

    # --- growth -------------------------------------------------------------------
    def resize(
        self, *, token_capacity: int | None = None, slot_capacity: int | None = None
    ) -> WriteWorkspace:
        """A new, zeroed workspace (``generation + 1``) with the given sizes (an omitted
        one is kept). Nothing is copied: a chain launched on ``self`` is stamped from
        ``self`` (which stays valid), and the new workspace needs a chain of its own. CUDA
        graphs captured on the old workspace must be re-captured."""
        self.check(views=True)
        return WriteWorkspace._allocate(
            self.token_capacity if token_capacity is None else token_capacity,
            self.slot_capacity if slot_capacity is None else slot_capacity,
            self.device,
            self.generation + 1,
        )

    def ensure_capacity(self, *, tokens: int = 0, slots: int = 0) -> WriteWorkspace:
        """``self`` when ``tokens`` tokens and ``slots`` slots fit, else :meth:`resize`.

        Growth policy: a token capacity that is too small becomes ``min(max(tokens, 2 *
        current), 2**31 - 1)`` (steps vary: doubling keeps resizes, and graph re-captures,
        logarithmic); a slot capacity becomes exactly ``slots`` (a KV pool grows in large,
        known steps, as ``CanaryStore.ensure_capacity``). Never shrinks; host numbers only,
        no sync."""
        need_t = check_need("tokens", tokens)
        need_n = check_need("slots", slots)
        self.check()
        t, n = self.token_capacity, self.slot_capacity
        if need_t <= t and need_n <= n:
            return self
        return self.resize(
            token_capacity=min(max(need_t, 2 * t), MAX_CAPACITY) if need_t > t else None,
            slot_capacity=need_n if need_n > n else None,
        )

    # --- copies ---------------------------------------------------------------------
    def __copy__(self) -> WriteWorkspace:
        raise TypeError(
            "kv-canary: a WriteWorkspace cannot be shallow-copied (two owners of one arena); "
            "use copy.deepcopy for an independent (zeroed) one, or resize() to grow it"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> WriteWorkspace:
        self.check(views=True)
        new = WriteWorkspace._allocate(
            self.token_capacity, self.slot_capacity, self.device, self.generation
        )
        memo[id(self)] = new
        return new

    def __reduce__(self) -> Any:
        self.check(views=True)
        return (
            _unpickle_workspace,
            (self.token_capacity, self.slot_capacity, str(self.device), self.generation),
        )

    # --- checks ---------------------------------------------------------------------
    def check(self, *, views: bool = False) -> None:
        """Re-check that the arena is intact and this workspace owns it (as
        :meth:`CanaryStore.check`); ``views=True`` also re-checks the private views behind
        the fields. Reads no data, never syncs; both split-write stages run it at every
        launch."""
        check_owned_arena(self, "_entries")
        if views:
            self._check_views()

    def _check_views(self) -> None:
        check_private_views(self, _get_fields, "build one with WriteWorkspace.allocate")

    @staticmethod
    def _raise_bad_field(bad: str) -> NoReturn:
        raise_moved_view("WriteWorkspace", "workspace", bad, arena_noun="WriteWorkspace")


WriteWorkspace.__doc__ = docstring_with_fields(WriteWorkspace.__doc__, WORKSPACE_FIELDS, "contents")


def _unpickle_workspace(
    token_capacity: int, slot_capacity: int, device: str, generation: int
) -> WriteWorkspace:
    return WriteWorkspace._allocate(token_capacity, slot_capacity, device, generation)
