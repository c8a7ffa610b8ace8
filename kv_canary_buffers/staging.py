"""``GraphInputs``: persistent per-row inputs for a plan captured in a CUDA graph.

A captured graph replays with the tensor addresses it was captured with, so the per-row
inputs must live in fixed, capacity-sized tensors. Capture the plan once with
``bs = capacity`` on these tensors, then before each replay call :meth:`GraphInputs.fill`
outside the graph: it copies the step's rows in place and turns every row past them into
padding (``req_pool_indices == 0``), which the plan skips whatever its lengths hold. One
captured plan then serves any batch of up to ``capacity`` rows. ``write_num_valid_reqs``
reads ``capacity`` after such a replay: padding rows are counted, as the contract says.

Like :class:`PlanBuffers`, the four tensors are fixed views into one allocation (an
:class:`~kv_canary_buffers.arena.Arena`), re-checked before every fill. Staging built with
:meth:`GraphInputs.for_buffers` remembers those buffers (and their generation): the plan
refuses its tensors with any other buffers, so staging kept across a resize is caught.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import attrs
import torch

from .arena import Arena, ArenaField, check_pinned, layout
from .buffers import STAGING_LINK_ATTR, PlanBuffers, StagingLink, _check_arena_layout
from .checks import check_bool, check_capacity, check_row_tensor, check_tensor
from .devices import DeviceLike, device_predicate, normalize_device
from .layout import PADDING_REQ_POOL_INDEX, ROW_DTYPE, STAGING_FIELDS, staging_specs
from .plan import check_buffers

_get_fields = operator.attrgetter(*STAGING_FIELDS)


def _layout(capacity: int) -> tuple[tuple[ArenaField, ...], int]:
    return layout(staging_specs(capacity))


def _layout_of(arena: Arena) -> tuple[tuple[ArenaField, ...], int]:
    return _layout(check_capacity("capacity", arena.fields[0].shape[0]))


def _check_link(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None and type(value) is not StagingLink:
        raise TypeError(
            "kv-canary: GraphInputs.link must be None or a StagingLink; build staging with "
            f"GraphInputs.allocate or GraphInputs.for_buffers, got {type(value).__name__}"
        )


@attrs.frozen(kw_only=True, eq=False, repr=False)
class GraphInputs:
    """Four int64 ``[capacity]`` tensors at fixed addresses, views into one arena:
    ``req_pool_indices``, ``prefix_lens``, ``extend_seq_lens`` and ``valid_lens`` (the
    per-row valid lengths of the expected-token pool; pass it only when the plan uses
    the pool).

    Built by :meth:`for_buffers` it is linked to those buffers (see :attr:`built_for`),
    and the plan refuses its tensors with any other ``PlanBuffers``; built by
    :meth:`allocate` it is unlinked and any buffers of enough capacity accept it (for
    example one staging shared by two buffer groups planned from the same rows).

    Copies: ``copy.copy`` and ``attrs.evolve`` are refused (two owners of one arena);
    ``copy.deepcopy`` makes a new arena with the same rows and the same link (to the
    deep copy of the buffers when they are copied in the same call); pickling keeps the
    rows and pickles the linked buffers along (so ``pickle.dumps((buffers, staging))``
    restores a linked pair).
    """

    arena: Arena = attrs.field(repr=False)
    link: StagingLink | None = attrs.field(default=None, validator=_check_link, repr=False)
    """The buffers this staging was built for (None: unlinked)."""
    req_pool_indices: torch.Tensor = attrs.field(repr=False)
    prefix_lens: torch.Tensor = attrs.field(repr=False)
    extend_seq_lens: torch.Tensor = attrs.field(repr=False)
    valid_lens: torch.Tensor = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        _check_arena_layout(self.arena, "GraphInputs", STAGING_FIELDS, _layout_of)
        fields = _get_fields(self)
        bad = self.arena.first_bad_field(fields)
        if bad is not None:
            self._raise_bad_field(bad, fields)
        self.arena.claim(self, "GraphInputs")
        for t in fields:  # tag the tensors (read by the plan's validation)
            setattr(t, STAGING_LINK_ATTR, self.link)

    # --- construction -------------------------------------------------------------
    @classmethod
    def allocate(cls, *, capacity: int, device: DeviceLike) -> GraphInputs:
        """Zeroed (all-padding), unlinked inputs for up to ``capacity`` rows on
        ``device``."""
        return cls._allocate(capacity, device, None)

    @classmethod
    def for_buffers(cls, buffers: PlanBuffers) -> GraphInputs:
        """Inputs sized ``buffers.write_req_capacity`` on ``buffers.device``, linked to
        ``buffers``: the plan refuses them with any other buffers (a resize makes other
        buffers: build new staging then)."""
        check_buffers(buffers).check(views=True)
        return cls._allocate(buffers.write_req_capacity, buffers.device, StagingLink.to(buffers))

    @classmethod
    def _allocate(
        cls, capacity: object, device: DeviceLike, link: StagingLink | None
    ) -> GraphInputs:
        cap = check_capacity("capacity", capacity)
        fields, nbytes = _layout(cap)
        arena, views = Arena.allocate(fields, nbytes, normalize_device(device))
        return cls(arena=arena, link=link, **views)

    # --- read from the arena ------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Rows the staging holds."""
        self.check()
        return self.arena.fields[0].shape[0]

    @property
    def device(self) -> torch.device:
        """Where the four tensors live."""
        self.check()
        return self.arena.device

    @property
    def built_for(self) -> PlanBuffers | None:
        """The :class:`PlanBuffers` this staging was built for, or None (unlinked, or
        those buffers no longer exist)."""
        self.check()
        link = self.link
        return None if link is None else link.buffers()

    @property
    def generation(self) -> int | None:
        """The generation of the buffers this staging was built for (None: unlinked)."""
        self.check()
        link = self.link
        return None if link is None else link.generation

    def __repr__(self) -> str:
        try:
            linked = "" if self.link is None else f", generation={self.generation!r}"
            return f"GraphInputs(capacity={self.capacity}, device={self.device!r}{linked})"
        except Exception:  # a tampered object must still print
            return "GraphInputs(<tampered>)"

    # --- checks -------------------------------------------------------------------
    def check(self) -> None:
        """Re-check that the four tensors are still their views of the arena and that
        this object owns it (as :meth:`PlanBuffers.check`)."""
        try:
            arena = self.arena
            fields = _get_fields(self)
        except AttributeError as err:
            raise AttributeError(
                f"kv-canary: GraphInputs is missing a field ({err}); build staging with "
                "GraphInputs.allocate or GraphInputs.for_buffers"
            ) from None
        if type(arena) is not Arena:
            raise TypeError(
                "kv-canary: GraphInputs.arena must be a kv_canary_buffers.arena.Arena, got "
                f"{type(arena).__name__} (the object was tampered with)"
            )
        check_pinned(self, arena)
        bad = arena.first_bad_field(fields)
        if bad is not None:
            self._raise_bad_field(bad, fields)
        _check_link(self, None, self.link)  # type: ignore[arg-type]
        if arena.owner() is not self:
            raise ValueError(
                "kv-canary: this GraphInputs does not own its arena (its fields were rebound "
                "to another GraphInputs' memory); build staging with GraphInputs.allocate"
            )

    def _raise_bad_field(self, name: str, fields: tuple[object, ...]) -> None:
        arena = self.arena
        if name == "<arena>":
            raise ValueError(
                "kv-canary: the GraphInputs arena's storage was resized or replaced; never "
                "resize a staging tensor's storage"
            )
        t = fields[STAGING_FIELDS.index(name)]
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"kv-canary: GraphInputs.{name} must be a torch.Tensor, got {type(t).__name__}"
            )
        capacity = arena.fields[0].shape[0]
        raise ValueError(
            f"kv-canary: GraphInputs.{name} must be its own int64 [{capacity}] view of the "
            f"staging's memory, got {t.dtype} shape {tuple(t.shape)} at another address or "
            "layout (rebound, evolved, swapped with .data/set_() or resized); build staging "
            "with GraphInputs.allocate or GraphInputs.for_buffers"
        )

    # --- filling ------------------------------------------------------------------
    def fill(
        self,
        *,
        req_pool_indices: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
    ) -> None:
        """Copy one step's rows (int64 ``[n]`` each, ``n <= capacity``, on ``device``)
        into rows ``[0, n)`` in place and make rows ``[n, capacity)`` padding. Runs
        outside the graph; allocates nothing. Checks every argument (and the staging
        itself) before it writes a byte; a source inside the staging's own memory is
        refused (the copies would read what they overwrite)."""
        self.check()
        arena = self.arena
        device = arena.device
        capacity = arena.fields[0].shape[0]
        on = device_predicate(device)
        check_tensor("req_pool_indices", req_pool_indices, ROW_DTYPE, 1, device, on)
        n = req_pool_indices.shape[0]
        if n > capacity:
            raise ValueError(
                f"kv-canary: len(req_pool_indices) must be <= GraphInputs.capacity, got {n} > "
                f"{capacity}; allocate GraphInputs for the resized PlanBuffers"
            )
        check_row_tensor("prefix_lens", prefix_lens, n, device, on)
        check_row_tensor("extend_seq_lens", extend_seq_lens, n, device, on)
        if valid_lens is not None:
            check_row_tensor("valid_lens", valid_lens, n, device, on)
        sources = (req_pool_indices, prefix_lens, extend_seq_lens, valid_lens)
        start = arena.base
        end = start + arena.nbytes
        for name, src in zip(STAGING_FIELDS, sources):
            # one range test (the sources are contiguous); the exact span on a hit
            if src is None:
                continue
            ptr = src.data_ptr()
            if ptr < end and ptr + src.nbytes > start and arena.overlaps(src):
                raise ValueError(
                    f"kv-canary: {name} must not share memory with the GraphInputs it fills, "
                    "got a tensor inside the staging (fill from the step's own tensors)"
                )
        for dst, src in zip(_get_fields(self), sources):
            if src is not None:
                dst[:n].copy_(src)
            dst[n:].zero_()
        self.req_pool_indices[n:].fill_(PADDING_REQ_POOL_INDEX)

    def plan_kwargs(self, *, with_valid_lens: bool = False) -> dict[str, torch.Tensor]:
        """The per-row keyword arguments of ``launch_plan``/``plan_reference``."""
        check_bool("with_valid_lens", with_valid_lens)
        self.check()
        kwargs = {
            "req_pool_indices": self.req_pool_indices,
            "prefix_lens": self.prefix_lens,
            "extend_seq_lens": self.extend_seq_lens,
        }
        if with_valid_lens:
            kwargs["req_to_verify_expected_tokens_valid_lens"] = self.valid_lens
        return kwargs

    # --- copies -------------------------------------------------------------------
    def __copy__(self) -> GraphInputs:
        raise TypeError(
            "kv-canary: a GraphInputs cannot be shallow-copied (two owners of one arena); "
            "use copy.deepcopy for an independent copy"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> GraphInputs:
        self.check()
        link = self.link
        if link is not None:
            # Staging deep-copied with its buffers follows the copy of the buffers.
            buffers = link.buffers()
            copied = memo.get(id(buffers)) if buffers is not None else None
            if type(copied) is PlanBuffers:
                link = StagingLink.to(copied)
        new = GraphInputs._allocate(self.arena.fields[0].shape[0], self.arena.device, link)
        new.arena.byte_view().copy_(self.arena.byte_view())
        memo[id(self)] = new
        return new

    def __reduce__(self) -> Any:
        self.check()
        link = self.link
        buffers = None if link is None else link.buffers()
        return (
            _unpickle_graph_inputs,
            (
                self.arena.fields[0].shape[0],
                str(self.arena.device),
                self.arena.byte_view().cpu(),
                link is not None,
                buffers,
            ),
        )


def _dead() -> None:
    return None


def _unpickle_graph_inputs(
    capacity: int,
    device: str,
    state: torch.Tensor,
    linked: bool,
    buffers: PlanBuffers | None,
) -> GraphInputs:
    link: StagingLink | None = None
    if buffers is not None:
        link = StagingLink.to(buffers)
    elif linked:  # built for buffers that no longer existed: refused by every buffers
        dead: Callable[[], PlanBuffers | None] = _dead
        link = StagingLink(dead, -1)
    staging = GraphInputs._allocate(capacity, device, link)
    staging.arena.byte_view().copy_(state)
    return staging
