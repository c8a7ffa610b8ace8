"""``RealKV``: the KV-cache layers whose bytes the canary fingerprints (optional).

With a ``RealKV`` of mode ``PARTIAL`` or ``ALL``, the write stage stores in each record a
hash of the slot's real KV bytes, and the verify stage recomputes it: KV bytes overwritten
by a stray kernel then show up as ``FailBits.REAL_KV`` violations (docs/contract-canary.md,
"Real-KV hash"). Each source (:class:`RealKVSource`) has a geometry of its own, and a
``RealKV`` takes up to ``MAX_REAL_KV_SOURCES`` of them: every layer's K and V.
"""

from __future__ import annotations

import copy
import enum
import math
from typing import Any

import attrs
import torch

from .checks import check_index, check_positive
from .hashing import sm
from .layout import (
    INT64_MAX,
    MAX_REAL_KV_SOURCES,
    REAL_KV_ALIGN,
    RECORD_DTYPE,
    SOURCE_TABLE_COLUMNS,
)
from .live import next_handle, register_real_kv


class RealKVMode(enum.IntEnum):
    """How many bytes of each slot's KV the real-KV hash reads."""

    NONE = 0
    """No real-KV hash: records store 0 and verify compares with 0."""
    PARTIAL = 1
    """The first 16 bytes of the slot's token in every source."""
    ALL = 2
    """``read_bytes`` bytes of the slot's token in every source (each its own)."""


_NONE = RealKVMode.NONE
_PARTIAL = RealKVMode.PARTIAL


def _to_mode(value: object) -> RealKVMode:
    if isinstance(value, RealKVMode):
        return value
    number = check_index("RealKV.mode", value, "a RealKVMode")
    try:
        return RealKVMode(number)
    except ValueError:
        raise ValueError(
            f"kv-canary: RealKV.mode must be a RealKVMode (0 NONE, 1 PARTIAL, 2 ALL), got {number}"
        ) from None


# --- one source ------------------------------------------------------------------------------
def _check_geometry(
    name: str, owner: str, tensor: object, page_size: object, bpt: object, read_bytes: object
) -> tuple[int, int, int]:
    """The rules of docs/contract-canary.md ("Real-KV hash") for one source: ``name``
    words the tensor in messages (``RealKVSource.tensor``, ``RealKV.sources[i]``),
    ``owner`` the integers (``RealKVSource``, ``RealKV``). Returns ``(page_size,
    bytes_per_token, read_bytes)`` as Python ints."""
    ps = check_positive(f"{owner}.page_size", page_size)
    bpt_ = check_positive(f"{owner}.bytes_per_token", bpt, REAL_KV_ALIGN)
    rb = bpt_ if read_bytes is None else read_bytes
    rb = check_positive(f"{owner}.read_bytes", rb, REAL_KV_ALIGN)
    if rb > bpt_:
        raise ValueError(
            f"kv-canary: {owner}.read_bytes must be <= bytes_per_token = {bpt_}, got {rb}"
        )
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    item = tensor.element_size()
    if tensor.dim() < 2:
        raise ValueError(
            f"kv-canary: {name} must be 2-D [pages, bytes of a page as elements] or at least "
            f"3-D [pages, page_size, ...], got shape {tuple(tensor.shape)} (view a layer "
            "as [num_pages, -1])"
        )
    if tensor.dim() == 2:
        if tensor.shape[1] > 1 and tensor.stride(1) != 1:
            raise ValueError(
                f"kv-canary: {name} must have contiguous rows (stride(1) == 1), "
                f"got strides {tensor.stride()}"
            )
        _check_aligned(name, tensor)
        need = ps * bpt_
        if tensor.shape[1] * item < need:
            raise ValueError(
                f"kv-canary: {name} rows must hold page_size * bytes_per_token = {need} "
                f"bytes, got {tensor.shape[1] * item}"
            )
        return ps, bpt_, rb
    # [pages, page_size, ...]: the geometry is the tensor's own.
    shape, strides = tuple(tensor.shape), tensor.stride()
    layout = f"shape {shape}, strides {strides}, {tensor.dtype}"
    expected = 1
    for size, stride in reversed(list(zip(shape[2:], strides[2:]))):
        if size != 1 and stride != expected:
            raise ValueError(
                f"kv-canary: {name} (at least 3-D: [pages, page_size, ...]) must be "
                f"contiguous within a slot (dimensions 2 on), got {layout}"
            )
        expected *= size
    _check_aligned(name, tensor)
    if shape[1] != ps:
        raise ValueError(
            f"kv-canary: {name} is read as [pages, page_size, ...], so page_size must be "
            f"its shape[1] = {shape[1]}, got page_size = {ps} ({layout}; a token-major "
            "[tokens, heads, head_dim] layer is 2-D as [tokens, -1] with page_size 1)"
        )
    slot_stride = strides[1] * item
    if shape[1] > 1 and slot_stride != bpt_:
        raise ValueError(
            f"kv-canary: {name} has slots {slot_stride} bytes apart (stride(1) * "
            f"element_size), so bytes_per_token must be {slot_stride}, got {bpt_} ({layout})"
        )
    slot_bytes = math.prod(shape[2:]) * item
    if rb > slot_bytes:
        given = "the default, bytes_per_token" if read_bytes is None else "given"
        raise ValueError(
            f"kv-canary: {owner}.read_bytes must be <= the {slot_bytes} bytes of one slot of "
            f"{name} ({layout}), got {rb} ({given})"
        )
    return ps, bpt_, rb


def _check_aligned(name: str, tensor: torch.Tensor) -> None:
    item = tensor.element_size()
    if tensor.data_ptr() % REAL_KV_ALIGN or (tensor.stride(0) * item) % REAL_KV_ALIGN:
        raise ValueError(
            f"kv-canary: {name} must start 16-byte aligned with a row stride that is a "
            f"multiple of 16 bytes, got data_ptr % 16 = {tensor.data_ptr() % REAL_KV_ALIGN} "
            f"and a row stride of {tensor.stride(0) * item} bytes"
        )


@attrs.frozen(eq=False)
class RealKVSource:
    """One KV tensor the real-KV hash reads, with its own geometry (SGLang's
    ``RealKvSource``): slot ``s`` is read in row ``s // page_size`` at byte ``(s %
    page_size) * bytes_per_token`` of the row.

    ``tensor`` is either 2-D ``[pages, a page's bytes as elements]`` of any dtype (rows
    contiguous, each at least ``page_size * bytes_per_token`` bytes; bytes past that are
    never read, so a row may hold other data after its slots), or at least 3-D ``[pages,
    page_size, ...]`` contiguous within a slot (dimensions 2 on), whose ``page_size``
    (``shape[1]``) and ``bytes_per_token`` (``stride(1) * element_size``) must then be
    the tensor's own. Either way it starts 16-byte aligned with a row stride in bytes
    that is a multiple of 16. Pass the engine's own KV tensors (for example
    ``k_buffer[layer].view(num_pages, -1)``), never copies: a copy fingerprints a stale
    snapshot.

    Attributes:
        tensor: the source (positional or keyword).
        page_size: slots per row, ``>= 1`` (keyword).
        bytes_per_token: bytes from one slot to the next in a row, a positive multiple of
            16 (keyword).
        read_bytes: bytes hashed per slot in mode ``ALL`` (a positive multiple of 16,
            ``<= bytes_per_token`` and, for a tensor of 3 or more dimensions, at most a
            slot's own bytes; default: ``bytes_per_token``). ``PARTIAL`` always hashes 16.
    """

    tensor: torch.Tensor = attrs.field(repr=False)
    page_size: int = attrs.field(kw_only=True)
    bytes_per_token: int = attrs.field(kw_only=True)
    read_bytes: int = attrs.field(kw_only=True, default=None)

    def __attrs_post_init__(self) -> None:
        ps, bpt, rb = _check_geometry(
            "RealKVSource.tensor",
            "RealKVSource",
            self.tensor,
            self.page_size,
            self.bytes_per_token,
            self.read_bytes,
        )
        object.__setattr__(self, "page_size", ps)
        object.__setattr__(self, "bytes_per_token", bpt)
        object.__setattr__(self, "read_bytes", rb)

    @property
    def rows(self) -> int:
        """Rows (pages) of the source: it covers slots ``[0, rows * page_size)``."""
        return int(self.tensor.shape[0])


# --- the sources of one call -------------------------------------------------------------------
Fingerprint = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype, int]


def _fingerprint(src: torch.Tensor) -> Fingerprint:
    """What :meth:`RealKV.check` compares: address, shape, strides, dtype (the element
    size) and the end of the storage."""
    storage = src.untyped_storage()
    return (
        src.data_ptr(),
        src.shape,
        src.stride(),
        src.dtype,
        storage.data_ptr() + storage.nbytes(),
    )


def _span(src: torch.Tensor) -> tuple[int, int]:
    """``[start, end)`` byte addresses of every element ``src`` can address (as
    ``arena.tensor_span``; empty as ``(0, 0)``)."""
    if src.numel() == 0:
        return (0, 0)
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(src.shape, src.stride()))
    start = src.data_ptr()
    return (start, start + extent * src.element_size())


def _merged(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``spans`` (empty ones dropped) as the fewest disjoint ``[start, end)`` ranges: the
    sources of one KV pool are one range, whatever their number."""
    out: list[list[int]] = []
    for lo, hi in sorted(s for s in spans if s[0] < s[1]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _to_sources(value: object) -> tuple[object, ...]:
    if isinstance(value, (torch.Tensor, RealKVSource)):
        return (value,)
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            "kv-canary: RealKV.sources must be a tuple or list of up to "
            f"{MAX_REAL_KV_SOURCES} RealKVSource objects or tensors, got {type(value).__name__}"
        )
    return tuple(value)


@attrs.frozen(kw_only=True, eq=False)
class RealKV:
    """The KV tensors whose bytes the records fingerprint: up to ``MAX_REAL_KV_SOURCES``
    (512) sources, each a :class:`RealKVSource` with its own geometry, all on one device.

    A plain tensor in ``sources`` is a :class:`RealKVSource` with this object's
    ``page_size``, ``bytes_per_token`` and ``read_bytes`` (which a plain tensor needs;
    with only :class:`RealKVSource` objects they may be left out). Build a new ``RealKV``
    when the engine reallocates its KV cache; at every launch each source must still be
    the memory it was built on (:meth:`check`) and cover the store (``rows * page_size >=
    num_slots``).

    The kernels read the sources' geometry from a small table this object owns (int64
    ``[num_sources, 6]`` on the sources' device, ``layout.SOURCE_TABLE_COLUMNS``), built
    once here: a launch allocates nothing, whatever the number of sources.

    Attributes:
        mode: :class:`RealKVMode` (``NONE``, ``PARTIAL`` or ``ALL``).
        sources: tuple of :class:`RealKVSource` (plain tensors given are wrapped).
        page_size: slots per row of the plain tensors given, ``>= 1`` (or None).
        bytes_per_token: bytes of one slot in a row of the plain tensors given, a
            positive multiple of 16 (or None).
        read_bytes: bytes hashed per slot of the plain tensors given in mode ``ALL`` (a
            positive multiple of 16, ``<= bytes_per_token``; default: ``bytes_per_token``).
    """

    mode: RealKVMode = attrs.field(converter=_to_mode)
    sources: tuple[RealKVSource, ...] = attrs.field(converter=_to_sources, repr=False)
    page_size: int | None = None
    bytes_per_token: int | None = None
    read_bytes: int | None = None
    _sources: tuple[RealKVSource, ...] = attrs.field(init=False, repr=False)
    """``sources`` as built: :meth:`check` refuses a ``sources`` rebound since."""
    _tensors: tuple[torch.Tensor, ...] = attrs.field(init=False, repr=False)
    """The sources' tensors as built: what both paths read (and :meth:`check` checks)."""
    _fingerprint: tuple[Fingerprint, ...] = attrs.field(init=False, repr=False)
    _storages: tuple[tuple[torch.UntypedStorage, int, int], ...] = attrs.field(
        init=False, repr=False
    )
    """Each distinct storage of the sources, with its address and size at construction:
    checked once per launch however many sources are views of it."""
    _spans: tuple[tuple[int, int], ...] = attrs.field(init=False, repr=False)
    """The bytes the sources address, merged into disjoint ranges: a function of their
    fingerprints, so valid whenever :meth:`check` passes (the launch's aliasing test reads
    it instead of the tensors)."""
    _covers: int = attrs.field(init=False, repr=False)
    """The slots every source covers, ``min(rows * page_size)``: a launch refuses a store
    with more slots (one comparison)."""
    _source_table: torch.Tensor = attrs.field(init=False, repr=False)
    """int64 ``[num_sources, 6]`` on the sources' device (``SOURCE_TABLE_COLUMNS``; empty
    without a hash): the geometry the kernels read."""
    _handle: int = attrs.field(init=False, repr=False)
    """A number of its own (never reused in the process): how a launch traced by
    ``torch.compile`` names this object to its operator (:mod:`kv_canary_buffers.live`)."""

    def __attrs_post_init__(self) -> None:
        ps = None if self.page_size is None else check_positive("RealKV.page_size", self.page_size)
        bpt = (
            None
            if self.bytes_per_token is None
            else check_positive("RealKV.bytes_per_token", self.bytes_per_token, REAL_KV_ALIGN)
        )
        rb = self.read_bytes
        if rb is not None:
            rb = check_positive("RealKV.read_bytes", rb, REAL_KV_ALIGN)
        if bpt is not None:
            rb = bpt if rb is None else rb
            if rb > bpt:
                raise ValueError(
                    f"kv-canary: RealKV.read_bytes must be <= bytes_per_token = {bpt}, got {rb}"
                )
        object.__setattr__(self, "page_size", ps)
        object.__setattr__(self, "bytes_per_token", bpt)
        object.__setattr__(self, "read_bytes", rb)
        given = self.sources
        if len(given) > MAX_REAL_KV_SOURCES:
            raise ValueError(
                f"kv-canary: RealKV.sources must hold at most {MAX_REAL_KV_SOURCES} sources, "
                f"got {len(given)}"
            )
        sources = tuple(self._to_source(i, src) for i, src in enumerate(given))
        tensors = tuple(s.tensor for s in sources)
        for i, t in enumerate(tensors[1:], 1):
            if t.device != tensors[0].device:
                raise ValueError(
                    f"kv-canary: RealKV.sources[{i}] must be on {tensors[0].device} like "
                    f"sources[0], got {t.device}"
                )
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "_sources", sources)
        object.__setattr__(self, "_tensors", tensors)
        object.__setattr__(self, "_fingerprint", tuple(map(_fingerprint, tensors)))
        storages: dict[int, tuple[torch.UntypedStorage, int, int]] = {}
        for t in tensors:
            st = t.untyped_storage()
            storages.setdefault(st.data_ptr(), (st, st.data_ptr(), st.nbytes()))
        object.__setattr__(self, "_storages", tuple(storages.values()))
        object.__setattr__(self, "_spans", _merged([_span(t) for t in tensors]))
        object.__setattr__(
            self, "_covers", min((s.rows * s.page_size for s in sources), default=INT64_MAX)
        )
        object.__setattr__(self, "_source_table", self._build_table(tensors))
        object.__setattr__(self, "_handle", next_handle())
        register_real_kv(self)

    def _to_source(self, i: int, src: object) -> RealKVSource:
        if isinstance(src, RealKVSource):
            return src
        name = f"RealKV.sources[{i}]"
        if not isinstance(src, torch.Tensor):
            raise TypeError(
                f"kv-canary: {name} must be a RealKVSource or a torch.Tensor, "
                f"got {type(src).__name__}"
            )
        for arg in ("page_size", "bytes_per_token"):
            if getattr(self, arg) is None:
                raise TypeError(
                    f"kv-canary: RealKV.{arg} must be an int when sources holds a plain "
                    f"tensor ({name}), got None (or pass RealKVSource objects, each with its "
                    "own geometry)"
                )
        args = (src, self.page_size, self.bytes_per_token, self.read_bytes)
        _check_geometry(name, "RealKV", *args)  # worded for this object's arguments
        return RealKVSource(src, page_size=args[1], bytes_per_token=args[2], read_bytes=args[3])  # type: ignore[arg-type]

    def _build_table(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The kernels' source table over ``tensors`` (these sources' tensors, or copies of
        them of the same layout but for the row stride: see :meth:`_table_over`)."""
        device = tensors[0].device if tensors else torch.device("cpu")
        if self.mode is _NONE or not tensors:
            return torch.zeros((0, len(SOURCE_TABLE_COLUMNS)), dtype=RECORD_DTYPE)
        rows = []
        for src, t in zip(self._sources, tensors):
            hashed = REAL_KV_ALIGN if self.mode is _PARTIAL else src.read_bytes
            rows.append(
                (
                    t.data_ptr(),
                    t.stride(0) * t.element_size() // 8,
                    t.shape[0],
                    src.page_size,
                    src.bytes_per_token // 8,
                    hashed // 8,
                )
            )
        return torch.tensor(rows, dtype=RECORD_DTYPE).to(device)

    def _table_over(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """A source table over ``tensors`` instead of this object's sources: copies of
        them (``torch.compile``'s functionalization may pass copies), each of the same
        shape, dtype and strides but perhaps the row stride, 16-byte aligned. Allocates
        (and copies to the device); the caller checks the layouts."""
        return self._build_table(tensors)

    # A copy is a new RealKV built by the constructor: its own fingerprint, table and
    # handle (copying the slots would carry the original's, and a launch traced by
    # torch.compile would then validate the original while reading the copy's sources).
    def __copy__(self) -> RealKV:
        return self._rebuilt(self._sources)

    def __deepcopy__(self, memo: dict[int, Any]) -> RealKV:
        return self._rebuilt(
            tuple(
                RealKVSource(
                    copy.deepcopy(s.tensor, memo),
                    page_size=s.page_size,
                    bytes_per_token=s.bytes_per_token,
                    read_bytes=s.read_bytes,
                )
                for s in self._sources
            )
        )

    def __reduce__(self) -> Any:
        return (
            _rebuild_real_kv,
            (self.mode, self._sources, self.page_size, self.bytes_per_token, self.read_bytes),
        )

    def _rebuilt(self, sources: tuple[RealKVSource, ...]) -> RealKV:
        return _rebuild_real_kv(
            self.mode, sources, self.page_size, self.bytes_per_token, self.read_bytes
        )

    def check(self) -> None:
        """Re-check that every source is still the memory it was validated as (address,
        shape, strides, dtype, storage size): the launchers run it, so a source whose
        storage was resized or swapped since construction is refused instead of read out
        of bounds. Reads no data. Host time grows with the number of sources (about a
        third of a microsecond each on a CPU of this project's CI)."""
        # _fingerprint inline (no frame, no tuple per source), each distinct storage once
        # (a source re-pointed to another storage changes its address: the storage it was
        # built on is held here, so no other allocation can take its address); named on a
        # miss by the slow path.
        if self.sources is self._sources:
            for src, (ptr, shape, stride, dtype, _end) in zip(self._tensors, self._fingerprint):
                if (
                    src.data_ptr() != ptr
                    or src.shape != shape
                    or src.stride() != stride
                    or src.dtype is not dtype
                ):
                    break
            else:
                for storage, ptr, nbytes in self._storages:
                    if storage.data_ptr() != ptr or storage.nbytes() != nbytes:
                        break
                else:
                    return
        self._check_slowly()

    def _check_slowly(self) -> None:
        """:meth:`check` one source at a time: raise naming the first that changed (or
        the first one missing or added, on a ``sources`` rebound)."""
        sources = tuple(self.sources)
        known = self._fingerprint
        i = 0
        while (
            i < len(sources)
            and i < len(known)
            and sources[i] is self._sources[i]
            and _fingerprint(self._tensors[i]) == known[i]
        ):
            i += 1
        if i == len(sources) == len(known) and sources == self._sources:
            return
        raise ValueError(
            f"kv-canary: RealKV.sources[{i}] changed since the RealKV was built "
            "(its storage was resized, swapped or moved); build a new RealKV for the "
            "engine's current KV tensors"
        )

    @property
    def hashed_bytes(self) -> int:
        """Bytes hashed per slot, all sources together: 16 a source (``PARTIAL``), the
        sum of the sources' ``read_bytes`` (``ALL``), or 0 (``NONE``, or no source)."""
        mode = self.mode
        if mode is _NONE:
            return 0
        if mode is _PARTIAL:
            return REAL_KV_ALIGN * len(self._sources)
        return sum(s.read_bytes for s in self._sources)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The sources' tensors, in order."""
        return self._tensors

    @property
    def device(self) -> torch.device:
        """The sources' device (CPU when there is none)."""
        return self._tensors[0].device if self._tensors else torch.device("cpu")

    def source_rows(self) -> tuple[int, ...]:
        """Rows (pages) of each source."""
        return tuple(t.shape[0] for t in self._tensors)


def first_uncovered_source(real_kv: RealKV, num_slots: int) -> int | None:
    """Index of the first source that covers fewer than ``num_slots`` slots (``rows *
    page_size``), or None."""
    for i, s in enumerate(real_kv._sources):
        if s.rows * s.page_size < num_slots:
            return i
    return None


def _slot_bytes(src: RealKVSource, tensor: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 ``[rows, (page_size - 1) * bytes_per_token + width]``: every byte the hash can
    read of ``tensor``, row by row, from the tensor's start (its storage seen as bytes)."""
    item = tensor.element_size()
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    raw.set_(tensor.untyped_storage())
    span = (src.page_size - 1) * src.bytes_per_token + width
    return raw.as_strided(
        (tensor.shape[0], span), (tensor.stride(0) * item, 1), tensor.storage_offset() * item
    )


def first_row_past_sources(real_kv: RealKV | None, slots: torch.Tensor) -> int | None:
    """Index into ``slots`` (non-negative int64) of the first slot whose page row lies at
    or past some source's rows, or None. (Never, for slots of a store the sources cover,
    which every launch checks first: a bounds check kept behind that rule.)"""
    if real_kv is None or real_kv.hashed_bytes == 0 or slots.numel() == 0:
        return None
    bad = torch.zeros_like(slots, dtype=torch.bool)
    for s in real_kv._sources:
        bad |= slots // s.page_size >= s.rows
    if not bool(bad.any()):
        return None
    return int(bad.nonzero()[0, 0])


def real_kv_hash(real_kv: RealKV | None, slots: torch.Tensor) -> torch.Tensor:
    """The contract's ``real_kv(s)`` for each of ``slots`` (int64 ``[m]``, every one in
    range, see :func:`first_row_past_sources`): int64 ``[m]``, zeros without a hash."""
    out = torch.zeros_like(slots)
    if real_kv is None or real_kv.hashed_bytes == 0 or slots.numel() == 0:
        return out
    for src, tensor in zip(real_kv._sources, real_kv._tensors):
        width = REAL_KV_ALIGN if real_kv.mode is _PARTIAL else src.read_bytes
        page = slots // src.page_size
        start = (slots % src.page_size) * src.bytes_per_token
        cols = start[:, None] + torch.arange(width, device=slots.device)
        as_bytes = _slot_bytes(src, tensor, width)
        chunk = as_bytes[page[:, None], cols].contiguous().view(torch.int64)  # [m, width/8]
        acc = torch.zeros_like(slots)
        for k in range(chunk.shape[1]):
            acc = sm(acc ^ chunk[:, k])
        out = sm(out ^ acc)
    return out


def _rebuild_real_kv(
    mode: RealKVMode,
    sources: tuple[RealKVSource, ...],
    page_size: int | None,
    bytes_per_token: int | None,
    read_bytes: int | None,
) -> RealKV:
    return RealKV(
        mode=mode,
        sources=sources,
        page_size=page_size,
        bytes_per_token=bytes_per_token,
        read_bytes=read_bytes,
    )
