"""The canary inside transformers' continuous batching (``init_continuous_batching``,
``generate_batch``, ``PagedAttentionCache``), installed with one call::

    manager = model.init_continuous_batching(continuous_batching_config=cb_config)
    canary = kv_canary_engines.transformers.install(model, manager, CanaryConfig(...))
    manager.start(); ...                      # or model.generate_batch(...) on this manager

Two forward hooks on the model (``register_forward_pre_hook(..., with_kwargs=True)`` and
``register_forward_hook(..., with_kwargs=True)``), no patch of transformers: the pre-hook
reads the forward's paged-attention kwargs (``write_index``, ``read_index``,
``block_table``, ``input_ids``, ``position_ids``, ``cache``) and the manager's batch
(request ids, lengths, the scheduler's tokens) and runs the runtime's ``begin_step``
(plan, HEAD verify); the forward hook runs ``end_step`` (HEAD and TAIL writes, TAIL
verify, sweep, poll).

Supported: transformers 5.17 and 5.19 (:data:`SUPPORTED_VERSIONS`), full-attention models,
eager synchronous batching (no CUDA graphs, no ``torch.compile`` of the forward, no async
batching), no CPU offloading, one sequence per prompt. Anything else is refused at
install with a ``kv-canary:`` error naming what is supported. docs/engines/transformers.md
says what is checked and what the hooks cannot see.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, overload

import attrs
import torch

from kv_canary_buffers.layout import MAX_REAL_KV_SOURCES

from .reports import CanaryReport, RequestId
from .runtime import (
    CanaryConfig,
    CanaryRuntime,
    KVGroup,
    Row,
    StepBatch,
    SweepBatch,
)
from .tables import BlockTable, SlotTable, TokenSlots

logger = logging.getLogger("kv_canary")

SUPPORTED_VERSIONS = ("5.17", "5.19")
"""transformers minor versions whose continuous-batching internals this adapter reads
(5.17: one KV tensor per layer, slot = block * page + offset; 5.19: one flat cache tensor
cut into sectors, two trash sectors first)."""

_FULL = "full_attention"


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


class _Tokens(Sequence[int]):
    """A request's tokens (prompt, then generated) as one sequence, without copying."""

    def __init__(self, first: list[int], second: list[int]) -> None:
        self._a, self._b = first, second

    def __len__(self) -> int:
        return len(self._a) + len(self._b)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        a, b = self._a, self._b
        na = len(a)
        if isinstance(i, slice):  # the runtime's reads: one side's slice, no copy of both
            lo, hi, step = i.indices(na + len(b))
            if step != 1:
                return list(self)[i]
            if lo >= na:
                return b[lo - na : hi - na]
            if hi <= na:
                return a[lo:hi]
            return a[lo:] + b[: hi - na]
        return a[i] if i < na else b[i - na]

    def __iter__(self) -> Iterator[int]:
        yield from self._a
        yield from self._b


# --- the two cache layouts ---------------------------------------------------------------
class _Layout:
    """How one transformers version lays its KV out: the canary's slot numbering (one
    slot per token of a block: ``block * page_size + offset``), the real-KV views, the
    block tables."""

    num_slots: int
    page_size: int

    def slots(self, physical: torch.Tensor) -> torch.Tensor:
        """Canary slots of the cache's physical token indices (``write_index``,
        ``read_index``)."""
        raise NotImplementedError

    def read_slots(self, physical: torch.Tensor) -> torch.Tensor:
        """:meth:`slots` of ``read_index`` for a :class:`TokenSlots` table, which takes
        int32 as well (a layout whose index is the slot skips the cast)."""
        return self.slots(physical)

    def kernel_blocks(self, table: torch.Tensor) -> torch.Tensor:
        """Canary block ids of the decode fast path's ``block_table`` entries."""
        raise NotImplementedError

    def host_blocks(self, request_id: RequestId) -> list[int] | None:
        """The request's block ids from the allocator's host bookkeeping."""
        raise NotImplementedError

    def sources(self, layers: Sequence[int]) -> tuple[tuple[torch.Tensor, ...], int]:
        """Views of the K and V pages of ``layers`` (one row per block) and the bytes of
        one token in a row."""
        raise NotImplementedError


class _SectorLayout(_Layout):
    """transformers 5.19: ``cache.cache_tensor`` is one byte tensor; the full-attention
    allocator views it as ``[tokens, 2, heads, head_dim]`` and a block is
    ``2 * layers * page`` token rows (K then V page of each layer); a physical index is
    ``block * block_physical_stride + offset``. Sectors 0 and 1 are trash (never
    allocated), so block 0, canary slot 0, never holds a real token."""

    def __init__(self, cache: Any) -> None:
        allocator = cache.cache_allocators[_FULL]
        self._allocator = allocator
        self.page_size = int(allocator.tokens_per_page)
        self._stride = int(allocator.block_physical_stride)
        self._pages_stride = self._stride // self.page_size
        self._blocks = int(allocator._copy_view.shape[0])
        self.num_slots = self._blocks * self.page_size
        if int(allocator.read_trash_index) >= self._stride * int(allocator.blocks_per_sector):
            raise ValueError("kv-canary: transformers' read trash is not in sector 0")

    def slots(self, physical: torch.Tensor) -> torch.Tensor:
        # block * page + offset = p - block * (stride - page): two ops on the step's tokens
        block = torch.div(physical, self._stride, rounding_mode="floor")
        return torch.sub(physical, block, alpha=self._stride - self.page_size)

    def kernel_blocks(self, table: torch.Tensor) -> torch.Tensor:
        return torch.div(table.to(torch.int64), self._pages_stride, rounding_mode="floor")

    def host_blocks(self, request_id: RequestId) -> list[int] | None:
        blocks = self._allocator.block_table.get(request_id)
        return None if blocks is None else list(blocks)

    def sources(self, layers: Sequence[int]) -> tuple[tuple[torch.Tensor, ...], int]:
        a = self._allocator
        rows = a.cache_tensor.view(-1, a.num_key_value_heads * a.head_dim)  # [2 * tokens, HD]
        per_token = rows.shape[1]
        blocks = rows[: self._blocks * self._stride].reshape(self._blocks, self._stride * per_token)
        page = self.page_size * per_token
        out = []
        for layer in layers:
            i = list(a.layer_indices).index(layer)
            for kv in (0, 1):  # K page, then V page of layer i within each block
                start = (2 * i + kv) * page
                out.append(blocks[:, start : start + page])
        return tuple(out), per_token * rows.element_size()


class _BlockLayout(_Layout):
    """transformers 5.17: ``cache.key_cache[j]`` / ``value_cache[j]`` per layer, shape
    ``[(num_blocks + 2) * block_size, heads, head_dim]``; a physical index is the slot
    itself. The two trash blocks are the last two, so block 0 is a real block: a real
    token at slot 0 (the canary's padding slot) goes unchecked, and the runtime counts
    the steps where that happens (docs/engines/transformers.md)."""

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self.page_size = int(cache.block_size)
        self.num_slots = int(cache.key_cache[0].shape[0])
        self._manager = cache.group_cache_managers[0]
        self._layer_index = dict(cache.layer_index_to_group_indices)

    def slots(self, physical: torch.Tensor) -> torch.Tensor:
        return physical.to(torch.int64)

    def read_slots(self, physical: torch.Tensor) -> torch.Tensor:
        return physical  # (the index is the slot; int32 or int64, one op less a step)

    def kernel_blocks(self, table: torch.Tensor) -> torch.Tensor:
        return table  # int32 or int64: the runtime takes either

    def host_blocks(self, request_id: RequestId) -> list[int] | None:
        blocks = self._manager.block_table.get(request_id)
        return None if blocks is None else list(blocks)

    def holds_block0(self, request_ids: Sequence[RequestId]) -> bool:
        """Whether any of the requests holds block 0 (no copy of their block lists)."""
        tables = self._manager.block_table
        return any(0 in tables.get(rid, ()) for rid in request_ids)

    def sources(self, layers: Sequence[int]) -> tuple[tuple[torch.Tensor, ...], int]:
        out = []
        bytes_per_token = 0
        for layer in layers:
            _group, j = self._layer_index[layer]
            for kv in (self._cache.key_cache[j], self._cache.value_cache[j]):
                pages = kv.view(-1, self.page_size * kv.shape[1] * kv.shape[2])
                out.append(pages)
                bytes_per_token = kv.shape[1] * kv.shape[2] * kv.element_size()
        return tuple(out), bytes_per_token


# --- install ------------------------------------------------------------------------------
def _refuse(what: str) -> ValueError:
    return ValueError(f"kv-canary: {what}")


def _check_supported(model: Any, manager: Any) -> None:
    import transformers
    from transformers.generation.continuous_batching import ContinuousBatchingManager

    minor = _minor(transformers.__version__)
    if minor not in SUPPORTED_VERSIONS:
        raise _refuse(
            f"transformers {transformers.__version__} is not supported; supported: "
            + ", ".join(f"{v}.x" for v in SUPPORTED_VERSIONS)
        )
    if not isinstance(manager, ContinuousBatchingManager):
        raise TypeError(
            "kv-canary: manager must be the ContinuousBatchingManager of "
            f"model.init_continuous_batching(...), got {type(manager).__name__}"
        )
    if manager.model is not model:
        raise _refuse("manager was made by another model (manager.model is not model)")
    if getattr(model, "_kv_canary", None) is not None:
        raise _refuse("the canary is already installed on this model (canary.remove() first)")
    if manager.is_running():
        raise _refuse("install the canary before manager.start() (the loop is running)")
    cb = manager.continuous_batching_config
    if any(cb.cuda_graph_booleans):
        raise _refuse(
            f"use_cuda_graph={cb.use_cuda_graph!r} is not supported: the hooks run when a "
            "graph is captured, not when it replays; pass use_cuda_graph=False"
        )
    if cb.varlen_compile_config is not None or cb.decode_compile_config is not None:
        raise _refuse(
            "a torch.compile'd forward (varlen_compile_config / decode_compile_config) is "
            "not supported: run the forward eagerly (default_compile_level=0)"
        )
    if cb.use_async_batching:
        raise _refuse(
            "use_async_batching=True is not supported: the next batch is prepared while "
            "the forward runs; pass use_async_batching=False"
        )
    if cb.cpu_offload_space:
        raise _refuse(
            f"cpu_offload_space={cb.cpu_offload_space} is not supported: restored requests "
            "come back in other blocks without their canary records; pass "
            "cpu_offload_space=0 (requests are then soft reset and recomputed, which the "
            "canary follows)"
        )
    if manager.num_return_sequences != 1:
        raise _refuse(
            f"num_return_sequences={manager.num_return_sequences} is not supported: forked "
            "requests copy KV blocks the hooks do not see; use 1"
        )
    from transformers.generation.continuous_batching.cache import group_layers_by_attn_type

    groups = group_layers_by_attn_type(model.config.get_text_config())
    types = list(groups[1] if isinstance(groups, tuple) else groups)
    if set(types) != {_FULL}:
        raise _refuse(
            f"attention layer types {sorted(set(types))} are not supported; supported: "
            f"['{_FULL}'] (a sliding-window group is a ring buffer per request, whose "
            "slots the canary's window plan does not follow)"
        )


def install(
    model: Any,
    manager: Any,
    config: CanaryConfig | None = None,
    *,
    real_kv_layers: Sequence[int] = (0, -1),
) -> TransformersCanary:
    """Install the canary on ``model``'s continuous batching ``manager`` (before
    ``manager.start()`` or ``generate_batch``).

    ``real_kv_layers``: the layers whose K and V pages the real-KV hash reads (negative
    indices count from the last; at most 256 layers: a ``RealKV`` takes 512 sources).
    The manager also becomes the model's cached manager (as
    ``manager.stop(keep_for_next_session=True)`` makes it), so ``model.generate_batch``
    runs on it. Returns the :class:`TransformersCanary`; ``canary.remove()`` takes the
    hooks off.
    """
    _check_supported(model, manager)
    layers = model.config.get_text_config().num_hidden_layers
    chosen = sorted({layer % layers for layer in real_kv_layers})
    if 2 * len(chosen) > MAX_REAL_KV_SOURCES:
        raise _refuse(
            f"real_kv_layers: at most {MAX_REAL_KV_SOURCES // 2} layers "
            f"({MAX_REAL_KV_SOURCES} sources), got {len(chosen)}"
        )
    canary = TransformersCanary(model=model, manager=manager, config=config or CanaryConfig())
    canary._layers = tuple(chosen)
    canary._handles = [
        model.register_forward_pre_hook(canary._pre_forward, with_kwargs=True),
        model.register_forward_hook(canary._post_forward, with_kwargs=True),
    ]
    model._kv_canary = canary
    if getattr(model, "_cached_continuous_batching_manager", None) is None:
        # what manager.stop(keep_for_next_session=True) does: generate_batch reuses it
        model._cached_continuous_batching_manager = manager
    return canary


@attrs.define(eq=False)
class TransformersCanary:
    """The installed canary: its :class:`CanaryRuntime` (built at the first forward, when
    the cache exists), the reports its polls returned, and :meth:`abort`, a ready policy
    callback that cancels the named requests through the manager."""

    model: Any
    manager: Any
    config: CanaryConfig
    runtime: CanaryRuntime | None = None
    reports: list[CanaryReport] = attrs.Factory(list)
    slot0_steps: int = 0
    """Steps where a scheduled request held block 0 (transformers 5.17 only, read from
    the allocator's host tables): slot 0's checks were skipped there."""
    _layers: tuple[int, ...] = ()
    _handles: list[Any] = attrs.Factory(list)
    _layout: _Layout | None = None
    _cache: Any = None
    _in_step: bool = False

    def abort(self, request_ids: frozenset[RequestId], report: CanaryReport) -> None:
        """Policy callback: cancel every named request (``manager.cancel_request``)."""
        for rid in request_ids:
            self.manager.cancel_request(rid)

    def remove(self) -> None:
        """Take the hooks off the model (and the manager off the model's cache, where
        :func:`install` put it)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if getattr(self.model, "_kv_canary", None) is self:
            self.model._kv_canary = None
        if getattr(self.model, "_cached_continuous_batching_manager", None) is self.manager:
            del self.model._cached_continuous_batching_manager

    # --- the hooks ----------------------------------------------------------------------
    def _processor(self, kwargs: dict[str, Any]) -> Any:
        cache = kwargs.get("cache")
        bp = self.manager.batch_processor
        if cache is None or bp is None or bp.cache is not cache:
            return None  # not this manager's continuous-batching forward
        return bp

    def _start(self, cache: Any) -> CanaryRuntime:
        import transformers

        layout: _Layout = (
            _BlockLayout(cache)
            if _minor(transformers.__version__) == "5.17"
            else _SectorLayout(cache)
        )
        sources, bytes_per_token = layout.sources(self._layers)
        group = KVGroup(
            name=_FULL,
            num_slots=layout.num_slots,
            page_size=layout.page_size,
            real_kv_sources=sources,
            real_kv_bytes_per_token=bytes_per_token,
            slot0_real=isinstance(layout, _BlockLayout),
        )
        self._layout, self._cache = layout, cache
        device = sources[0].device
        cb_config = self.manager.continuous_batching_config
        limit = getattr(cb_config, "max_requests_per_batch", None)
        tokens = getattr(cb_config, "max_batch_tokens", None)  # the split write's workspaces
        self.runtime = CanaryRuntime(
            self.config,
            [group],
            device=device,
            sweep_source=self._sweep_batch,
            expected_requests=limit if type(limit) is int and limit > 0 else 0,
            expected_tokens=tokens if type(tokens) is int and tokens > 0 else 0,
        )
        return self.runtime

    def _pre_forward(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        bp = self._processor(kwargs)
        if bp is None:
            return
        runtime = self.runtime if self._cache is kwargs["cache"] else self._start(kwargs["cache"])
        assert runtime is not None and self._layout is not None
        if self._in_step:  # the previous forward raised: its step wrote nothing
            runtime.discard_step()
            self._in_step = False
        layout = self._layout
        active = bp.scheduler.active_requests
        for rid in runtime.live_requests() - set(active):
            runtime.release(rid)  # finished, cancelled or soft reset since the last step
        batch = bp.inputs_and_outputs.requests_in_batch
        if any(str(fs.state.request_id).startswith("__warmup_") for fs in batch):
            return  # warm-up forwards of fake requests (freed right after): not checked
        rows = []
        for fs in batch:
            state = fs.state
            q = int(fs.query_length)
            rows.append(
                Row(
                    request_id=state.request_id,
                    prefix_len=int(state.position_offset) - q,
                    extend_len=q,
                    tokens=_Tokens(state.initial_tokens, state.generated_tokens),
                )
            )
        n = sum(r.extend_len for r in rows)
        block_table = kwargs.get("block_table")
        if block_table is not None:  # the decode fast path: every row writes one token
            blocks = layout.kernel_blocks(block_table[0])
            table: SlotTable = BlockTable(table=blocks)
            prefix = torch.tensor([r.prefix_len for r in rows], dtype=torch.int64)
            prefix = prefix.to(blocks.device, non_blocking=True)
            rows_idx = torch.arange(len(rows), device=blocks.device)
            ps = layout.page_size
            out = blocks[rows_idx, torch.div(prefix, ps, rounding_mode="floor")] * ps + prefix % ps
        else:
            out = layout.slots(kwargs["write_index"][0][:n])
            read = kwargs["read_index"][0]
            if read.numel() == 0:
                if any(r.prefix_len for r in rows):
                    raise RuntimeError(
                        "kv-canary: transformers passed no read_index for a batch with cached "
                        "prefixes"
                    )
                table = TokenSlots(slots=out)
            else:
                table = TokenSlots(slots=layout.read_slots(read))
        if isinstance(layout, _BlockLayout) and layout.holds_block0([r.request_id for r in rows]):
            self.slot0_steps += 1  # 5.17: block 0 is real, its slot 0 goes unchecked
        runtime.begin_step(
            StepBatch(
                rows=rows,
                tables={_FULL: table},
                out_cache_loc={_FULL: out},
                input_ids=kwargs["input_ids"],
                positions=kwargs["position_ids"],
            )
        )
        self._in_step = True

    def _post_forward(
        self, _module: Any, _args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not self._in_step or self.runtime is None:
            return
        self._in_step = False
        report = self.runtime.end_step()
        if report is not None:
            self.reports.append(report)

    def _sweep_batch(self) -> SweepBatch | None:
        bp = self.manager.batch_processor
        if bp is None or self._layout is None:
            return None
        requests: list[tuple[RequestId, int]] = []
        tables: list[list[int]] = []
        for rid, state in bp.scheduler.active_requests.items():
            blocks = self._layout.host_blocks(rid)
            length = int(state.position_offset)
            if not blocks or not length:
                continue
            requests.append((rid, length))
            tables.append(blocks)
        if not requests:
            return None
        width = max(len(b) for b in tables)
        padded = [b + [0] * (width - len(b)) for b in tables]
        assert self.runtime is not None
        table = torch.tensor(padded, dtype=torch.int64).to(self.runtime.device)
        return SweepBatch(requests=requests, tables={_FULL: BlockTable(table=table)})
