"""``RealKV``: the KV-cache layers whose bytes the canary fingerprints (optional).

With a ``RealKV`` of mode ``PARTIAL`` or ``ALL``, the write stage stores in each record a
hash of the slot's real KV bytes, and the verify stage recomputes it: KV bytes overwritten
by a stray kernel then show up as ``FailBits.REAL_KV`` violations (docs/contract.md,
"Real-KV hash").
"""

from __future__ import annotations

import copy
import enum
from typing import Any

import attrs
import torch

from .checks import check_index, check_positive
from .hashing import sm
from .layout import MAX_REAL_KV_SOURCES, REAL_KV_ALIGN
from .live import next_handle, register_real_kv


class RealKVMode(enum.IntEnum):
    """How many bytes of each slot's KV the real-KV hash reads."""

    NONE = 0
    """No real-KV hash: records store 0 and verify compares with 0."""
    PARTIAL = 1
    """The first 16 bytes of the slot's token in every source."""
    ALL = 2
    """``read_bytes`` bytes of the slot's token in every source."""


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


Fingerprint = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype, int]


def _fingerprint(src: torch.Tensor) -> Fingerprint:
    """What :meth:`RealKV.check` compares: address, shape, strides, dtype (the element
    size, and the kernels' pointer type) and the end of the storage."""
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


def _to_sources(value: object) -> tuple[torch.Tensor, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            "kv-canary: RealKV.sources must be a tuple of up to "
            f"{MAX_REAL_KV_SOURCES} tensors, got {type(value).__name__}"
        )
    return tuple(value)


@attrs.frozen(kw_only=True, eq=False)
class RealKV:
    """Up to four live views of KV-cache layers, read as bytes, with their geometry.

    Every source is a 2-D tensor of any dtype whose rows are pages: slot ``s`` lives in
    row ``s // page_size`` at byte ``(s % page_size) * bytes_per_token``. Rows must be
    contiguous (``stride(1) == 1``), start 16-byte aligned (``data_ptr`` and the row stride
    in bytes multiples of 16) and hold at least ``page_size * bytes_per_token`` bytes. Pass
    the engine's own KV tensors (for example ``k_buffer[layer].view(num_pages, -1)``),
    never copies: a copy fingerprints a stale snapshot. Build a new ``RealKV`` when the
    engine reallocates its KV cache.

    Attributes:
        mode: :class:`RealKVMode` (``NONE``, ``PARTIAL`` or ``ALL``).
        sources: tuple of up to 4 tensors, all on one device.
        page_size: slots per source row, ``>= 1``.
        bytes_per_token: bytes of one slot in a row, a positive multiple of 16.
        read_bytes: bytes hashed per slot and source in mode ``ALL`` (a positive multiple
            of 16, ``<= bytes_per_token``; default: ``bytes_per_token``). ``PARTIAL``
            always hashes 16.
    """

    mode: RealKVMode = attrs.field(converter=_to_mode)
    sources: tuple[torch.Tensor, ...] = attrs.field(converter=_to_sources, repr=False)
    page_size: int
    bytes_per_token: int
    read_bytes: int = attrs.field(default=None)
    _fingerprint: tuple[Fingerprint, ...] = attrs.field(init=False, repr=False)
    _spans: tuple[tuple[int, int], ...] = attrs.field(init=False, repr=False)
    """Per source, the bytes it addresses: a function of its fingerprint, so valid
    whenever :meth:`check` passes (the launch's aliasing test reads it instead of the
    tensors)."""
    _handle: int = attrs.field(init=False, repr=False)
    """A number of its own (never reused in the process): how a launch traced by
    ``torch.compile`` names this object to its operator (:mod:`kv_canary_buffers.live`)."""

    def __attrs_post_init__(self) -> None:
        ps = check_positive("RealKV.page_size", self.page_size)
        bpt = check_positive("RealKV.bytes_per_token", self.bytes_per_token, REAL_KV_ALIGN)
        rb = bpt if self.read_bytes is None else self.read_bytes
        rb = check_positive("RealKV.read_bytes", rb, REAL_KV_ALIGN)
        if rb > bpt:
            raise ValueError(
                f"kv-canary: RealKV.read_bytes must be <= bytes_per_token = {bpt}, got {rb}"
            )
        object.__setattr__(self, "page_size", ps)
        object.__setattr__(self, "bytes_per_token", bpt)
        object.__setattr__(self, "read_bytes", rb)
        if len(self.sources) > MAX_REAL_KV_SOURCES:
            raise ValueError(
                f"kv-canary: RealKV.sources must hold at most {MAX_REAL_KV_SOURCES} tensors, "
                f"got {len(self.sources)}"
            )
        for i, src in enumerate(self.sources):
            self._check_source(i, src)
        object.__setattr__(self, "_fingerprint", tuple(map(_fingerprint, self.sources)))
        object.__setattr__(self, "_spans", tuple(map(_span, self.sources)))
        object.__setattr__(self, "_handle", next_handle())
        register_real_kv(self)

    # A copy is a new RealKV built by the constructor: its own fingerprint and its own
    # handle (copying the slots would carry the original's, and a launch traced by
    # torch.compile would then validate the original while reading the copy's sources).
    def __copy__(self) -> RealKV:
        return self._rebuilt(self.sources)

    def __deepcopy__(self, memo: dict[int, Any]) -> RealKV:
        return self._rebuilt(tuple(copy.deepcopy(src, memo) for src in self.sources))

    def __reduce__(self) -> Any:
        return (
            _rebuild_real_kv,
            (self.mode, self.sources, self.page_size, self.bytes_per_token, self.read_bytes),
        )

    def _rebuilt(self, sources: tuple[torch.Tensor, ...]) -> RealKV:
        return _rebuild_real_kv(
            self.mode, sources, self.page_size, self.bytes_per_token, self.read_bytes
        )

    def check(self) -> None:
        """Re-check that every source is still the memory it was validated as (address,
        shape, strides, storage size): the launchers run it, so a source whose storage
        was resized or swapped since construction is refused instead of read out of
        bounds. Reads no data."""
        sources = self.sources
        known = self._fingerprint
        # _fingerprint inline (no frame, no tuple per source); named on a miss.
        if type(sources) is tuple and len(sources) == len(known):
            for src, (ptr, shape, stride, dtype, end) in zip(sources, known):
                storage = src.untyped_storage()
                if (
                    src.data_ptr() != ptr
                    or src.shape != shape
                    or src.stride() != stride
                    or src.dtype is not dtype
                    or storage.data_ptr() + storage.nbytes() != end
                ):
                    break
            else:
                return
        self._check_slowly()

    def _check_slowly(self) -> None:
        """:meth:`check` one source at a time: raise naming the first that changed (or
        the first one missing or added, on a ``sources`` rebound to another number)."""
        sources = tuple(self.sources)
        known = self._fingerprint
        i = 0
        while i < len(sources) and i < len(known) and _fingerprint(sources[i]) == known[i]:
            i += 1
        if i == len(sources) == len(known):
            return
        raise ValueError(
            f"kv-canary: RealKV.sources[{i}] changed since the RealKV was built "
            "(its storage was resized, swapped or moved); build a new RealKV for the "
            "engine's current KV tensors"
        )

    def _check_source(self, i: int, src: object) -> None:
        name = f"RealKV.sources[{i}]"
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(src).__name__}")
        if src.dim() != 2:
            raise ValueError(
                f"kv-canary: {name} must be 2-D [pages, bytes of a page as elements], "
                f"got shape {tuple(src.shape)} (view it as [num_pages, -1])"
            )
        if src.device != self.sources[0].device:
            raise ValueError(
                f"kv-canary: {name} must be on {self.sources[0].device} like sources[0], "
                f"got {src.device}"
            )
        item = src.element_size()
        if src.shape[1] > 1 and src.stride(1) != 1:
            raise ValueError(
                f"kv-canary: {name} must have contiguous rows (stride(1) == 1), "
                f"got strides {src.stride()}"
            )
        if src.data_ptr() % REAL_KV_ALIGN or (src.stride(0) * item) % REAL_KV_ALIGN:
            raise ValueError(
                f"kv-canary: {name} must start 16-byte aligned with a row stride that is a "
                f"multiple of 16 bytes, got data_ptr % 16 = {src.data_ptr() % REAL_KV_ALIGN} "
                f"and a row stride of {src.stride(0) * item} bytes"
            )
        need = self.page_size * self.bytes_per_token
        if src.shape[1] * item < need:
            raise ValueError(
                f"kv-canary: {name} rows must hold page_size * bytes_per_token = {need} "
                f"bytes, got {src.shape[1] * item}"
            )

    @property
    def hashed_bytes(self) -> int:
        """Bytes hashed per slot and source: 16 (``PARTIAL``), ``read_bytes`` (``ALL``)
        or 0 (``NONE``)."""
        mode = self.mode
        if mode is _NONE or not self.sources:
            return 0
        return REAL_KV_ALIGN if mode is _PARTIAL else self.read_bytes

    @property
    def device(self) -> torch.device:
        """The sources' device (CPU when there is none)."""
        return self.sources[0].device if self.sources else torch.device("cpu")

    def source_rows(self) -> tuple[int, ...]:
        """Rows (pages) of each source."""
        return tuple(src.shape[0] for src in self.sources)


def first_row_past_sources(real_kv: RealKV | None, slots: torch.Tensor) -> int | None:
    """Index into ``slots`` (non-negative int64) of the first slot whose page row lies at
    or past some source's rows, or None."""
    if real_kv is None or real_kv.hashed_bytes == 0 or slots.numel() == 0:
        return None
    page = slots // real_kv.page_size
    bad = page >= min(real_kv.source_rows())
    if not bool(bad.any()):
        return None
    return int(bad.nonzero()[0, 0])


def real_kv_hash(real_kv: RealKV | None, slots: torch.Tensor) -> torch.Tensor:
    """The contract's ``real_kv(s)`` for each of ``slots`` (int64 ``[m]``, every one in
    range, see :func:`first_row_past_sources`): int64 ``[m]``, zeros without a hash."""
    out = torch.zeros_like(slots)
    if real_kv is None or real_kv.hashed_bytes == 0 or slots.numel() == 0:
        return out
    width = real_kv.hashed_bytes
    page = slots // real_kv.page_size
    start = (slots % real_kv.page_size) * real_kv.bytes_per_token
    cols = start[:, None] + torch.arange(width, device=slots.device)
    for src in real_kv.sources:
        as_bytes = src.view(torch.uint8) if src.shape[1] else src.reshape(src.shape[0], 0)
        chunk = as_bytes[page[:, None], cols].contiguous().view(torch.int64)  # [m, width/8]
        acc = torch.zeros_like(slots)
        for k in range(chunk.shape[1]):
            acc = sm(acc ^ chunk[:, k])
        out = sm(out ^ acc)
    return out


def _rebuild_real_kv(
    mode: RealKVMode,
    sources: tuple[torch.Tensor, ...],
    page_size: int,
    bytes_per_token: int,
    read_bytes: int,
) -> RealKV:
    return RealKV(
        mode=mode,
        sources=sources,
        page_size=page_size,
        bytes_per_token=bytes_per_token,
        read_bytes=read_bytes,
    )
