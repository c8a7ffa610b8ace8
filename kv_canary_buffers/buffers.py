"""``PlanBuffers``: the one owner of every tensor the plan writes.

An engine builds one per KV pool (buffer group), keeps it alive from the plan to the last
kernel that reads the plan, and passes it to :func:`kv_canary_buffers.plan_reference` or
:func:`kv_canary_kernels.launch_plan`. Every tensor is sized from the two capacities by
construction (see :data:`kv_canary_buffers.layout.BUFFER_SPECS`), so an offsets buffer of
``write_req_capacity`` elements cannot exist.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Optional, Tuple

import attrs
import torch

from .devices import DeviceLike, device_predicate, normalize_device
from .layout import BUFFER_SPECS, MAX_CAPACITY
from .status import PlanStatus


def _check_capacity(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_CAPACITY:
        raise ValueError(
            f"kv-canary: {name} must be in [1, {MAX_CAPACITY}] (counters are int32), got {value}"
        )
    return value


def _capacity_validator(_inst: object, attribute: attrs.Attribute, value: object) -> None:
    _check_capacity(attribute.name, value)


def _generation_validator(_inst: object, attribute: attrs.Attribute, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"kv-canary: generation must be an int >= 0, got {value!r}")


_FIELD_NAMES = tuple(BUFFER_SPECS)
_get_fields = operator.attrgetter(*_FIELD_NAMES)  # one C call for all tensors


@functools.lru_cache(maxsize=64)
def _expected_layout(
    write_req_capacity: int, verify_capacity: int
) -> Tuple[Tuple[str, torch.dtype, Tuple[int, ...], int], ...]:
    """``(name, dtype, shape, nbytes)`` of every field, in field order."""
    layout = []
    for name, (dtype, shape_fn, _role) in BUFFER_SPECS.items():
        shape = shape_fn(write_req_capacity, verify_capacity)
        layout.append((name, dtype, shape, math.prod(shape) * dtype.itemsize))
    return tuple(layout)


def _tensor_field() -> Any:
    return attrs.field(repr=False)


@attrs.frozen(kw_only=True, eq=False)
class PlanBuffers:
    """Every output and scratch tensor of one plan, sized by construction.

    Build it with :meth:`allocate`; grow it with :meth:`resize` or :meth:`ensure_capacity`.
    Fields cannot be rebound, and the constructor (also reached through ``attrs.evolve``)
    checks every tensor against the capacities. With ``Cw = write_req_capacity`` and
    ``Cv = verify_capacity``:

    ==========================  =======  ============  ==========================================
    field                       dtype    shape         contents after a plan of ``bs`` rows
    ==========================  =======  ============  ==========================================
    write_offsets               int64    ``[Cw + 1]``  exclusive prefix sum of write counts;
                                                       ``[bs]`` = total, ``[bs+1:]`` = 0
    write_seed_slot_indices     int64    ``[Cw]``      chain seed slot per row (``-1``: none);
                                                       rows ``>= bs`` unspecified
    write_num_valid_reqs        int32    ``[1]``       ``bs`` (padding rows included)
    verify_slot_indices         int64    ``[Cv]``      slot of each verify entry
    verify_expected_tokens      int64    ``[Cv]``      expected token id (``-1``: unchecked)
    verify_expected_positions   int64    ``[Cv]``      position of each entry
    verify_prev_slot_indices    int64    ``[Cv]``      predecessor slot (``-1``: chain head)
    verify_num_valid            int32    ``[1]``       entries written, or ``Cv`` on overflow
    verify_enable               int32    ``[1]``       1, or 0 when the entries overflowed
    verify_offsets              int64    ``[Cw + 1]``  scratch: prefix sum of verify counts
    scan_block_sums             int64    ``[2, nb]``   scratch: per-block sums of the scan,
                                                       ``nb = ceil(Cw / OFFSETS_BLOCK)``
    verify_row_hints            int32    ``[nh]``      scratch: row of every 512th entry,
                                                       ``nh = ceil(Cv / ROW_HINT_STRIDE)``
    status                      int32    ``[1]``       sticky :class:`PlanStatus` bits
    dummy_int64, dummy_int32    int64,   ``[1]``       stand-in kernel pointers for an absent
                                int32                  LUT or token pool
    ==========================  =======  ============  ==========================================

    Verify entries at and after ``verify_num_valid`` are unspecified.
    """

    write_req_capacity: int = attrs.field(validator=_capacity_validator)
    verify_capacity: int = attrs.field(validator=_capacity_validator)
    device: torch.device = attrs.field(converter=normalize_device)
    generation: int = attrs.field(default=0, validator=_generation_validator)

    write_offsets: torch.Tensor = _tensor_field()
    write_seed_slot_indices: torch.Tensor = _tensor_field()
    write_num_valid_reqs: torch.Tensor = _tensor_field()
    verify_slot_indices: torch.Tensor = _tensor_field()
    verify_expected_tokens: torch.Tensor = _tensor_field()
    verify_expected_positions: torch.Tensor = _tensor_field()
    verify_prev_slot_indices: torch.Tensor = _tensor_field()
    verify_num_valid: torch.Tensor = _tensor_field()
    verify_enable: torch.Tensor = _tensor_field()
    verify_offsets: torch.Tensor = _tensor_field()
    scan_block_sums: torch.Tensor = _tensor_field()
    verify_row_hints: torch.Tensor = _tensor_field()
    status: torch.Tensor = _tensor_field()
    dummy_int64: torch.Tensor = _tensor_field()
    dummy_int32: torch.Tensor = _tensor_field()

    def __attrs_post_init__(self) -> None:
        self.check()
        self._check_no_overlap()

    # --- construction -------------------------------------------------------------
    @classmethod
    def allocate(
        cls, *, write_req_capacity: int, verify_capacity: int, device: DeviceLike
    ) -> "PlanBuffers":
        """Allocate zeroed buffers for up to ``write_req_capacity`` rows per plan and up
        to ``verify_capacity`` verify entries, on ``device``. Generation 0.

        Raises ``ValueError`` for a capacity outside ``[1, 2**31 - 1]``.
        """
        return cls._allocate(write_req_capacity, verify_capacity, device, generation=0)

    @classmethod
    def _allocate(
        cls, write_req_capacity: int, verify_capacity: int, device: DeviceLike, generation: int
    ) -> "PlanBuffers":
        w = _check_capacity("write_req_capacity", write_req_capacity)
        v = _check_capacity("verify_capacity", verify_capacity)
        dev = normalize_device(device)
        tensors = {
            name: torch.zeros(shape, dtype=dtype, device=dev)
            for name, dtype, shape, _nbytes in _expected_layout(w, v)
        }
        return cls(
            write_req_capacity=w, verify_capacity=v, device=dev, generation=generation, **tensors
        )

    @staticmethod
    def allocation_bytes(write_req_capacity: int, verify_capacity: int) -> int:
        """Bytes :meth:`allocate` takes for these capacities (equal to the result's
        :attr:`nbytes`), so an engine can budget memory before it allocates."""
        w = _check_capacity("write_req_capacity", write_req_capacity)
        v = _check_capacity("verify_capacity", verify_capacity)
        return sum(nbytes for _name, _dtype, _shape, nbytes in _expected_layout(w, v))

    @property
    def nbytes(self) -> int:
        """Bytes held by all tensors of this object."""
        return sum(
            getattr(self, name).numel() * getattr(self, name).element_size()
            for name in BUFFER_SPECS
        )

    # --- growth -------------------------------------------------------------------
    def resize(
        self, *, write_req_capacity: Optional[int] = None, verify_capacity: Optional[int] = None
    ) -> "PlanBuffers":
        """Return new, zeroed buffers with the given capacities (an omitted one is kept)
        and ``generation + 1``. ``self`` is left untouched and stays valid.

        The new tensors live at new addresses: a CUDA graph captured on an older
        generation still reads and writes the old tensors and must be re-captured.
        """
        return PlanBuffers._allocate(
            self.write_req_capacity if write_req_capacity is None else write_req_capacity,
            self.verify_capacity if verify_capacity is None else verify_capacity,
            self.device,
            generation=self.generation + 1,
        )

    def ensure_capacity(self, *, write_reqs: int = 0, verify_entries: int = 0) -> "PlanBuffers":
        """Grow-only helper: return ``self`` when ``write_reqs`` rows and
        ``verify_entries`` entries fit, otherwise :meth:`resize` with headroom.

        Growth policy: a capacity that is too small becomes
        ``min(max(needed, 2 * current), 2**31 - 1)``; one that fits is kept. Doubling keeps
        the number of resizes (and graph re-captures) logarithmic in the growth, at most
        twice the memory the largest step needed. Capacities never shrink.
        """
        for name, value in (("write_reqs", write_reqs), ("verify_entries", verify_entries)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"kv-canary: {name} must be an int >= 0, got {value!r}")
        if write_reqs <= self.write_req_capacity and verify_entries <= self.verify_capacity:
            return self

        def grown(current: int, needed: int) -> Optional[int]:
            if needed <= current:
                return None
            return min(max(needed, 2 * current), MAX_CAPACITY)

        return self.resize(
            write_req_capacity=grown(self.write_req_capacity, write_reqs),
            verify_capacity=grown(self.verify_capacity, verify_entries),
        )

    # --- checks -------------------------------------------------------------------
    def check(self) -> None:
        """Re-check every tensor's shape, dtype, contiguity and device against the
        capacities. Reads no data and never syncs; both plan paths run it at every
        launch, so a tensor swapped in behind the frozen guard is caught."""
        # Hot path (every launch): attribute reads only, no call per field beyond them.
        device = self.device
        on_cuda = device.type == "cuda"
        index = device.index
        on_device = device_predicate(device)
        layout = _expected_layout(self.write_req_capacity, self.verify_capacity)
        try:
            for t, (name, dtype, shape, _nbytes) in zip(_get_fields(self), layout):
                if not (
                    t.shape == shape
                    and t.dtype is dtype
                    and ((t.is_cuda and t.get_device() == index) if on_cuda else on_device(t))
                    and t.is_contiguous()
                ):
                    self._raise_field_error(name, t, dtype, shape)
        except AttributeError:
            for t, (name, dtype, shape, _nbytes) in zip(_get_fields(self), layout):
                self._raise_field_error(name, t, dtype, shape)
            raise

    def _raise_field_error(
        self, name: str, t: object, dtype: torch.dtype, shape: Tuple[int, ...]
    ) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"kv-canary: PlanBuffers.{name} must be a torch.Tensor, got {type(t).__name__}"
            )
        if t.shape != shape:
            if name == "write_offsets":
                got = t.shape[0] if t.dim() == 1 else t.numel()
                raise ValueError(
                    "kv-canary: write_offsets_len must equal write_req_capacity + 1, "
                    f"got {got} and {self.write_req_capacity}"
                )
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must have shape {tuple(shape)} for "
                f"write_req_capacity={self.write_req_capacity}, "
                f"verify_capacity={self.verify_capacity}, got {tuple(t.shape)}"
            )
        if t.dtype != dtype:
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must have dtype {dtype}, got {t.dtype}"
            )
        if not device_predicate(self.device)(t):
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must be on device {self.device} "
                f"(PlanBuffers.device), got {t.device}"
            )
        if not t.is_contiguous():
            raise ValueError(
                f"kv-canary: PlanBuffers.{name} must be contiguous, got strides {t.stride()}"
            )

    def _check_no_overlap(self) -> None:
        spans = sorted(
            (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
            for name in BUFFER_SPECS
            for t in (getattr(self, name),)
        )
        for (_s0, end0, name0), (start1, _e1, name1) in zip(spans, spans[1:]):
            if start1 < end0:
                raise ValueError(
                    f"kv-canary: PlanBuffers.{name0} and PlanBuffers.{name1} must not share "
                    "memory, got overlapping storage"
                )

    # --- status -------------------------------------------------------------------
    def take_status(self) -> PlanStatus:
        """Return the sticky :class:`PlanStatus` flags raised since the last call and
        clear them. Reads device memory: this synchronizes with the current stream, so
        call it between steps (for example every N steps), never inside graph capture."""
        flags = PlanStatus(int(self.status.item()))
        self.status.zero_()
        return flags
