"""One device allocation per buffers object, every field a fixed view into it.

A buffers object (:class:`~kv_canary_buffers.PlanBuffers`,
:class:`~kv_canary_buffers.CanaryStore`) allocates a single zeroed ``uint8`` tensor (the
arena) and carves each field out of it at an offset fixed by its layout table, kept as a
private view; the public field is a :class:`FieldAlias`, a new alias of that view at each
read. Two fields cannot overlap by construction. The launch-time check proves the arena
in place (its storage at its address with its size, the object's first view at the
arena's construction-time address); :meth:`Arena.first_bad_field` proves each private
view still the view it was built as (data pointer at its offset, dtype, shape,
contiguity), for the paths that hand the views out as tensors.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NoReturn, overload

import attrs
import torch

from .devices import device_predicate
from .live import next_handle, register_arena

ALIGN = 256
"""Byte alignment of every field (as ``cudaMalloc``'s): any vector width a kernel uses."""


@attrs.frozen
class ArenaField:
    """Where one field lives in the arena."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """Byte offset from the arena's start (a multiple of :data:`ALIGN`)."""
    nbytes: int


FieldSpec = tuple[str, torch.dtype, tuple[int, ...]]


def layout(specs: Iterable[FieldSpec]) -> tuple[tuple[ArenaField, ...], int]:
    """Offsets of ``(name, dtype, shape)`` fields packed in order, each aligned to
    :data:`ALIGN`; and the arena's total bytes."""
    fields = []
    offset = 0
    for name, dtype, shape in specs:
        nbytes = math.prod(shape) * dtype.itemsize
        fields.append(ArenaField(name, dtype, tuple(shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(fields), offset


@attrs.frozen(eq=False)
class Arena:
    """The one allocation behind a buffers object, and the facts needed to re-check it."""

    storage: torch.UntypedStorage = attrs.field(repr=False)
    base: int
    """The arena's data pointer at allocation."""
    nbytes: int
    device: torch.device
    fields: tuple[ArenaField, ...] = attrs.field(repr=False)
    tensor: torch.Tensor = attrs.field(repr=False)
    """The allocation itself: one ``uint8`` tensor of ``nbytes`` over every byte of the
    arena. A launch traced by ``torch.compile`` declares this tensor as what it writes
    (``kv_canary_kernels.compiled``)."""
    _owner: list[weakref.ref[Any]] = attrs.field(factory=list, repr=False)
    """A weak reference to the one object built on this arena (empty until claimed)."""
    handle: int = attrs.field(init=False)
    """A number of its own, never reused in the process: how a launch traced by
    ``torch.compile`` names this arena to its operator (:mod:`kv_canary_buffers.live`)."""
    device_index: int = attrs.field(init=False)
    """``Tensor.get_device()`` of a tensor on the arena's device (-1 on the CPU)."""
    on_device: Callable[[torch.Tensor], bool] = attrs.field(init=False, repr=False)
    """``device_predicate(device)``: whether a tensor lives on the arena's device (the
    launches' input checks read it instead of looking the predicate up per call)."""
    _expected: tuple[tuple[Any, ...], ...] = attrs.field(init=False, repr=False)
    """Per field, what the check compares: (address, dtype, shape, whether the field has
    more than one element), computed once (one tuple a field unpacks faster in the hot
    loop than five transposed ones)."""
    _names: tuple[str, ...] = attrs.field(init=False, repr=False)
    address: Mapping[str, int] = attrs.field(init=False, repr=False)
    """Each field's data pointer (the arena's base plus the field's offset), read-only."""
    _key: tuple[int, int] = attrs.field(init=False, repr=False)
    """``(handle, base)`` as they were at construction: what the launchers' caches are
    keyed by (``kv_canary_kernels.launcher``), out of reach of a rebound ``handle`` or
    ``base``."""
    _pinned: tuple[Any, ...] = attrs.field(init=False, repr=False)
    """The objects of :data:`PINNED` as they were at construction: what every launch
    reads from the arena besides the storage and the base (the capacities and layout, the
    device and its predicate, the fields' addresses, the launch numbers, the handle),
    re-tested by identity at every launch (:func:`check_owned_arena`), so that rebinding
    one behind the frozen guard (``object.__setattr__``) is refused before anything is
    written."""
    _subsets: dict[tuple[str, ...], Any] = attrs.field(init=False, repr=False, factory=dict)
    launches: Iterator[int] = attrs.field(
        init=False, repr=False, factory=lambda: itertools.count(1)
    )
    """Numbers for the launches on this arena that need one, 1, 2, ... (the plan's eager
    one-launch path: ``kv_canary_kernels/plan/large_batch.py``). Per arena, so a launch's
    parity alternates on its own buffers; a copy's arena starts again at 1, with its sync
    words zeroed."""

    def __attrs_post_init__(self) -> None:
        index = self.device.index if self.device.type == "cuda" else -1
        object.__setattr__(self, "device_index", index)
        object.__setattr__(self, "on_device", device_predicate(self.device))
        object.__setattr__(
            self,
            "_expected",
            tuple(
                (self.base + f.offset, f.dtype, torch.Size(f.shape), math.prod(f.shape) > 1)
                for f in self.fields
            ),
        )
        object.__setattr__(self, "_names", tuple(f.name for f in self.fields))
        object.__setattr__(
            self,
            "address",
            MappingProxyType({f.name: self.base + f.offset for f in self.fields}),
        )
        object.__setattr__(self, "handle", next_handle())
        object.__setattr__(self, "_key", (self.handle, self.base))
        object.__setattr__(self, "_pinned", tuple(getattr(self, name) for name in PINNED))
        register_arena(self)

    @classmethod
    def allocate(
        cls, fields: tuple[ArenaField, ...], nbytes: int, device: torch.device
    ) -> tuple[Arena, dict[str, torch.Tensor]]:
        """A zeroed arena of ``nbytes`` on ``device`` and a view per field."""
        raw = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        views = {
            f.name: raw[f.offset : f.offset + f.nbytes].view(f.dtype).view(f.shape) for f in fields
        }
        # torch.compile: the arena's address is fixed for its lifetime, which is what
        # torch._dynamo.mark_static_address records (without importing dynamo here): CUDA
        # graph trees (mode="reduce-overhead") then accept the launches' in-place writes
        # instead of skipping the graph, and never copy the arena.
        raw._dynamo_static_input_type = "unguarded"  # type: ignore[attr-defined]
        arena = cls(raw.untyped_storage(), raw.data_ptr(), nbytes, raw.device, fields, raw)
        return arena, views

    def claim(self, owner: object, kind: str) -> None:
        """Record ``owner`` as the one object built on this arena; refuse a second
        (``attrs.evolve`` or a constructor call reusing a live object's arena)."""
        current = self._owner[0]() if self._owner else None
        if current is not None and current is not owner:
            raise ValueError(
                f"kv-canary: this arena already belongs to a live {kind}; two owners of one "
                "arena would write the same memory (use copy.deepcopy for an independent "
                "copy, or resize() for a larger one)"
            )
        self._owner[:] = [weakref.ref(owner)]

    def owner(self) -> object | None:
        """The live object that claimed this arena, or None."""
        return self._owner[0]() if self._owner else None

    def byte_view(self) -> torch.Tensor:
        """A ``uint8`` tensor over every byte of the arena (fields and alignment gaps),
        for whole-arena copies; allocates nothing."""
        storage = self.storage
        raw = torch.empty(0, dtype=torch.uint8, device=storage.device)
        return raw.set_(storage, 0, (self.nbytes,), (1,))

    def first_bad_field(
        self, tensors: Sequence[object], names: tuple[str, ...] | None = None
    ) -> str | None:
        """The name of the first field in ``tensors`` (in layout order) that is no longer
        its view of this arena, ``"<arena>"`` if the storage itself moved or shrank, or
        None when all are intact. Reads no data; never syncs.

        Per field: the data pointer at the field's offset, the dtype and the shape. With
        the storage intact, that pins every byte a kernel addresses (kernels take their
        bounds from the layout, not from the tensors), and it catches a field rebound,
        swapped with ``.data =`` or ``set_()``, or a storage resized. Fields of more than
        one element are also tested for contiguity: the torch references write through
        each tensor's own strides, so a same-shaped view whose strides were rewritten in
        place (``as_strided_``) would scatter their writes over other fields.

        With ``names``, ``tensors`` are those fields only, in that order
        (``PlanBuffers.check_fields``)."""
        if names is None:
            expected, field_names = self._expected, self._names
        else:
            subset = self._subsets.get(names)
            expected, field_names = self._subset(names) if subset is None else subset
        storage = self.storage
        if storage.data_ptr() != self.base or storage.nbytes() != self.nbytes:
            return "<arena>"
        try:
            for t, (ptr, dtype, shape, multi) in zip(tensors, expected):
                if (
                    t.data_ptr() != ptr  # type: ignore[attr-defined]
                    or t.dtype is not dtype  # type: ignore[attr-defined]
                    or t.shape != shape  # type: ignore[attr-defined]
                    or (multi and not t.is_contiguous())  # type: ignore[attr-defined]
                ):
                    break
            else:
                return None
        except (AttributeError, TypeError, RuntimeError):
            pass
        # Name the first field that is not its view, testing each without raising.
        for t, (ptr, dtype, shape, _multi), name in zip(tensors, expected, field_names):
            if not _is_view(t, ptr, dtype, shape):
                return name
        return None

    def _subset(
        self, names: tuple[str, ...]
    ) -> tuple[tuple[tuple[Any, ...], ...], tuple[str, ...]]:
        cached = self._subsets.get(names)
        if cached is None:
            index = {name: i for i, name in enumerate(self._names)}
            cached = (tuple(self._expected[index[n]] for n in names), names)
            self._subsets[names] = cached
        return cached

    def overlaps(self, t: torch.Tensor) -> bool:
        """Whether any byte ``t`` can address lies inside the arena (one range test)."""
        return spans_overlap(tensor_span(t), (self.base, self.base + self.nbytes))


PINNED = ("fields", "device", "on_device", "address", "launches", "handle")
"""The :class:`Arena` attributes a launch reads that no storage test covers; each is
compared by identity with its construction-time object at every launch."""


def check_pinned(obj: Any, arena: Arena) -> None:
    """Refuse ``obj``'s ``arena`` if one of its :data:`PINNED` attributes is no longer the
    object it was at construction (rebound with ``object.__setattr__``: a larger
    ``fields`` would have the kernels store past each field into its neighbours). Six
    identity tests, no data read."""
    pinned = arena._pinned
    if (
        arena.fields is pinned[0]
        and arena.device is pinned[1]
        and arena.on_device is pinned[2]
        and arena.address is pinned[3]
        and arena.launches is pinned[4]
        and arena.handle is pinned[5]
    ):
        return
    rebound = [name for name, was in zip(PINNED, pinned) if getattr(arena, name) is not was]
    kind = type(obj).__name__
    raise ValueError(
        f"kv-canary: {kind}.arena.{rebound[0]} must be the object the arena was built with, "
        f"got another (rebound behind the frozen guard: the layout, device and addresses "
        f"every launch relies on come from it); build one with {kind}.allocate and change "
        "it only through its own methods"
    )


def check_private_views(
    obj: Any,
    get_fields: Callable[[Any], Any],
    build_hint: str,
    names: tuple[str, ...] | None = None,
) -> None:
    """The ``views=True`` half of an owner's ``check()``: every private view ``get_fields``
    reads (the fields ``names`` only, in that order, when given) is still its view of
    ``obj.arena``; ``obj._raise_bad_field(name)`` words the first that is not. A missing
    view is an ``AttributeError`` ending in ``build_hint``."""
    kind = type(obj).__name__
    try:
        fields = get_fields(obj)
        if names is not None and len(names) == 1:
            fields = (fields,)
    except AttributeError as err:
        raise AttributeError(
            f"kv-canary: {kind} is missing a field ({err}); {build_hint}"
        ) from None
    bad = obj.arena.first_bad_field(fields, names)
    if bad is not None:
        obj._raise_bad_field(bad)


def raise_moved_view(
    kind: str, noun: str, bad: str, *, arena_noun: str | None = None, cause: str = ""
) -> NoReturn:
    """The error of a private view (or, ``bad == "<arena>"``, the arena's storage) that is
    no longer the memory the owner ``kind`` (a ``noun`` in the message) was built with."""
    if bad == "<arena>":
        raise ValueError(
            f"kv-canary: its arena's storage is no longer the memory the {arena_noun or noun} "
            "was built with (the storage was resized or freed through a tensor read from a "
            f"field); use the {noun} only through its own methods"
        )
    raise ValueError(
        f"kv-canary: {kind}.{bad} is no longer the memory the {noun} was built with (its "
        f"private view was rebound or swapped with .data/set_(){cause}); use the {noun} only "
        "through its own methods"
    )


def check_owned_arena(obj: Any, first_view: str) -> None:
    """The launch-time check of a buffers object ``obj`` (what its ``check()`` runs): its
    ``arena`` is an :class:`Arena`, the arena's storage is still at its address with its
    size, ``obj`` is the owner that claimed it, and the private view ``first_view`` (the
    field at offset 0) still starts at the base the arena had at construction
    (``Arena._key``), so that an ``Arena`` whose own attributes were rebound to match a
    moved or freed storage, or an arena claimed from a dead object and rebound, does not
    pass; and the arena's other attributes a launch reads are still their
    construction-time objects (:func:`check_pinned`). ``obj``'s own
    ``_raise_bad_field("<arena>")`` words a storage that moved, and its ``_check_views()``
    names a private view that is the cause. Reads no data, never syncs."""
    try:
        arena = obj.arena
    except AttributeError:
        kind = type(obj).__name__
        raise AttributeError(
            f"kv-canary: {kind} is missing its arena; build one with {kind}.allocate and "
            "never delete its attributes"
        ) from None
    if type(arena) is not Arena:
        kind = type(obj).__name__
        raise TypeError(
            f"kv-canary: {kind}.arena must be a kv_canary_buffers.arena.Arena, got "
            f"{type(arena).__name__} (the object was tampered with)"
        )
    pinned = arena._pinned  # check_pinned(obj, arena), its common case inline
    if not (
        arena.fields is pinned[0]
        and arena.device is pinned[1]
        and arena.on_device is pinned[2]
        and arena.address is pinned[3]
        and arena.launches is pinned[4]
        and arena.handle is pinned[5]
    ):
        check_pinned(obj, arena)  # raises, naming the attribute
    try:
        witness = getattr(obj, first_view).data_ptr()
    except (AttributeError, TypeError, RuntimeError):
        obj._check_views()  # raises, naming the field
        raise
    storage = arena.storage
    if storage.data_ptr() != arena.base or storage.nbytes() != arena.nbytes:
        obj._raise_bad_field("<arena>")
    owner = arena._owner
    owned = (owner[0]() if owner else None) is obj  # arena.owner(), inline
    if not owned:
        kind = type(obj).__name__
        raise ValueError(
            f"kv-canary: this {kind} does not own its arena (its arena was rebound to another "
            f"{kind} object's arena); build one with {kind}.allocate"
        )
    if witness != arena._key[1]:
        obj._check_views()  # a tampered first view: its own message (SGLang's, say)
        kind = type(obj).__name__
        raise ValueError(
            f"kv-canary: {kind}.arena is not the memory its fields were built on (the arena "
            f"or its attributes were rebound, or its storage moved); build one with "
            f"{kind}.allocate and change it only through its own methods"
        )


class FieldAlias:
    """A public tensor field of a buffers object, kept privately as ``_<name>``: each read
    returns a new alias of the private view (``Tensor.detach()``: the same memory, dtype,
    shape and strides, another tensor object), and assignment and deletion are refused.

    So nothing a caller does to the tensor it holds (``.data =``, ``set_()``,
    ``resize_()`` to fewer elements, ``as_strided_()``, ``torch.utils.swap_tensors``) can
    change the memory the object, its methods and the launches use: only the arena's
    storage is shared (a storage resized or freed through any alias is what ``check()``
    re-tests at every launch). Writes of data through an alias are writes to the field.
    A read costs about 0.3 us; hold the alias when a loop reads a field often. Messages
    name the class the field is declared in."""

    def __init__(self) -> None:
        self.kind = self.name = self.private = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.kind = owner.__name__
        self.name = name
        self.private = "_" + name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> FieldAlias: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> torch.Tensor: ...
    def __get__(self, obj: object, objtype: type | None = None) -> torch.Tensor | FieldAlias:
        if obj is None:
            return self
        view: torch.Tensor = getattr(obj, self.private)  # (dynamo traces getattr)
        try:
            return view.detach()
        except AttributeError:  # (an AttributeError, so that getattr's default applies)
            raise AttributeError(
                f"kv-canary: {self.kind}.{self.name} must be a torch.Tensor view, got "
                f"{type(view).__name__} (its private view was replaced: the object was "
                f"tampered with); build a new {self.kind} with allocate()"
            ) from None

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(
            f"kv-canary: {self.kind}.{self.name} cannot be assigned (each read of it returns a "
            f"new alias of memory the {self.kind} owns); write data into it in place (copy_, "
            f"fill_), or build a new {self.kind} with allocate() or resize()"
        )

    def __delete__(self, obj: object) -> None:
        raise AttributeError(
            f"kv-canary: {self.kind}.{self.name} cannot be deleted (the {self.kind} owns it)"
        )


def _is_view(t: object, ptr: int, dtype: torch.dtype, shape: torch.Size) -> bool:
    """The hot-path test of one field, safe on any object."""
    try:
        return (
            isinstance(t, torch.Tensor)
            and t.data_ptr() == ptr
            and t.dtype is dtype
            and t.shape == shape
            and t.is_contiguous()
        )
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return False


def tensor_span(t: torch.Tensor) -> tuple[int, int]:
    """``[start, end)`` byte addresses of every element ``t`` can address."""
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return (start, start + extent * t.element_size())


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two ``[start, end)`` byte ranges share a byte (empty ranges share none)."""
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]
