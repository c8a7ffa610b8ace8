# mypy: disable-error-code="import-not-found"
# (vLLM is installed in .venv-engines only; the lint runs in .venv.)
"""Faults injected into a running in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
the engine itself misbehaves (its block pool, prefix cache, slot mapping or KV bytes), not the
canary's inputs. For tests and demonstrations of :mod:`kv_canary_engines.vllm`.

Each fault is armed for one step (``at``, the canary runtime's step number) and records
in :attr:`VllmFaults.fired` the step at which the engine misbehaved (for the allocator
faults: when the block is handed out again, which may be steps after arming) and the
engine-core id of the request it harmed, which the canary's report must name.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import attrs
import torch


def _connector() -> Any:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


class Fault(enum.Enum):
    FREED_WHILE_REFERENCED = "page freed while still referenced"
    DOUBLE_ALLOCATION = "page handed to two live requests"
    OFF_BY_ONE_SLOT = "off-by-one in the slot mapping"
    KV_OVERWRITE = "KV bytes overwritten in a hashed layer"
    STALE_PREFIX_HIT = "stale prefix-cache hit"
    PADDING_WRITE = "padding write on a live slot"


@attrs.frozen(kw_only=True)
class Fired:
    fault: Fault
    step: int
    victim: str
    detail: str


class VllmFaults:
    """Arms faults in an in-process ``LLM`` whose canary :func:`install` turned on."""

    def __init__(self, llm: Any) -> None:
        core = llm.llm_engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.runner = core.model_executor.driver_worker.worker.model_runner
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.block_size = int(self.scheduler.cache_config.block_size)
        self.fired: list[Fired] = []
        self._armed: list[tuple[int, Fault]] = []
        if not hasattr(self.scheduler, "_kv_canary_schedule"):
            self.scheduler._kv_canary_schedule = self.scheduler.schedule
        self.scheduler.schedule = self._schedule
        self._donor: Any = None

    # --- where faults fire ------------------------------------------------------------
    @property
    def step(self) -> int:
        """The canary runtime's next step (what the next forward's rows will carry)."""
        return int(_connector().worker.runtime.step)

    def arm(self, fault: Fault, at: int) -> None:
        self._armed.append((at, fault))

    def _schedule(self, *args: Any, **kwargs: Any) -> Any:
        due = [f for at, f in self._armed if at <= self.step]
        self._armed = [(at, f) for at, f in self._armed if at > self.step]
        for fault in due:
            if not getattr(self, "_" + fault.name.lower())():
                self._armed.append((self.step + 1, fault))  # nothing to harm yet: next step
        if self._donor is None:
            running = list(self.scheduler.running)
            if running and running[0].num_computed_tokens >= 4 * self.block_size:
                self._donor = running[0]
        return self.scheduler._kv_canary_schedule(*args, **kwargs)

    def _record(self, fault: Fault, victim: str, detail: str) -> bool:
        self.fired.append(Fired(fault=fault, step=self.step, victim=victim, detail=detail))
        return True

    def _victim(self) -> tuple[Any, Any] | None:
        """A running request and one of its full, computed blocks that no other request
        shares (``ref_cnt == 1``)."""
        manager = self.scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        for request in self.scheduler.running:
            blocks = manager.req_to_blocks[request.request_id]
            full = request.num_computed_tokens // self.block_size
            for block in blocks[:full]:
                if block.ref_cnt == 1 and not block.is_null:
                    return request, block
        return None

    # --- the scheduler's faults -------------------------------------------------------
    def _freed_while_referenced(self) -> bool:
        found = self._victim()
        if found is None:
            return False
        request, block = found
        self.pool.free_blocks([block])  # the victim still holds it in its table
        if block.ref_cnt == 0:  # reused first (a freed block usually waits at the back)
            self.pool.free_block_queue.remove(block)
            self.pool.free_block_queue.prepend_n([block])
        original = self.pool.get_new_blocks

        def reuse(num_blocks: int) -> list[Any]:
            got: list[Any] = original(num_blocks)
            if block in got:  # count the victim's stale reference again, so that vLLM's
                self.pool.get_new_blocks = original  # own ref-count asserts stay quiet
                block.ref_cnt += 1
                detail = f"block {block.block_id} reused"
                self._record(Fault.FREED_WHILE_REFERENCED, request.request_id, detail)
            return got

        self.pool.get_new_blocks = reuse
        return True

    def _double_allocation(self) -> bool:
        found = self._victim()
        if found is None:
            return False
        request, block = found
        original = self.pool.get_new_blocks

        def hand_out_twice(num_blocks: int) -> list[Any]:
            self.pool.get_new_blocks = original
            block.ref_cnt += 1
            self._record(Fault.DOUBLE_ALLOCATION, request.request_id, f"block {block.block_id}")
            return [block, *original(num_blocks - 1)] if num_blocks > 1 else [block]

        self.pool.get_new_blocks = hand_out_twice
        return True

    def _stale_prefix_hit(self) -> bool:
        donor = self._donor
        waiting = [r for r in self.scheduler.waiting if r.num_tokens > 4 * self.block_size]
        if donor is None or not waiting:
            return False
        coordinator = self.scheduler.kv_cache_manager.coordinator
        original: Callable[..., Any] = coordinator.find_longest_cache_hit
        by_hashes = {id(r.block_hashes): r for r in waiting}

        def stale(block_hashes: Any, max_length: int) -> Any:
            victim = by_hashes.get(id(block_hashes))
            if victim is None:
                return original(block_hashes, max_length)
            coordinator.find_longest_cache_hit = original
            # The cache answers with another prompt's blocks: the donor's.
            self._record(Fault.STALE_PREFIX_HIT, victim.request_id, f"donor {donor.request_id}")
            return original(donor.block_hashes, max_length)

        coordinator.find_longest_cache_hit = stale
        return True

    # --- the worker's faults ----------------------------------------------------------
    def _forward_once(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once, at the next forward, after the canary's HEAD verify."""
        model = self.runner.model

        def pre(_module: Any, _args: Any) -> None:
            handle.remove()
            hook()

        handle = model.register_forward_pre_hook(pre)

    def _batch(self) -> tuple[list[str], Any]:
        from vllm.forward_context import get_forward_context

        attn: Any = get_forward_context().attn_metadata
        return list(self.runner.input_batch.req_ids), next(iter(attn.values()))

    def _off_by_one_slot(self) -> bool:
        found = self._victim()
        if found is None:
            return False
        request = found[0]

        def shift() -> None:
            from vllm.forward_context import get_forward_context

            ids, meta = self._batch()
            if request.request_id not in ids:
                return
            b = ids.index(request.request_id)
            lo, hi = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1])
            seen: set[int] = set()
            mapping: Any = get_forward_context().slot_mapping
            for t in [meta.slot_mapping, *mapping.values()]:
                if t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    t[lo:hi] += 1

        self._forward_once(shift)
        return self._record(Fault.OFF_BY_ONE_SLOT, request.request_id, "slot mapping + 1")

    def _kv_overwrite(self) -> bool:
        found = self._victim()
        if found is None:
            return False
        request, block = found
        slot = int(block.block_id) * self.block_size + 1

        def scribble() -> None:
            kv = self._layer0()
            blocks, heads, bs, two_d = kv.shape
            v = kv.view(blocks, heads, 2 * bs, two_d // 2)
            v[slot // bs, 0, bs + slot % bs, 0] += 1.0

        self._forward_once(scribble)
        return self._record(Fault.KV_OVERWRITE, request.request_id, f"slot {slot}")

    def _layer0(self) -> torch.Tensor:
        kv: torch.Tensor = next(iter(_connector().kv_caches.values()))
        return kv

    def _padding_write(self) -> bool:
        found = self._victim()
        if found is None:
            return False
        request, block = found
        slot = int(block.block_id) * self.block_size + 1
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention import Attention

        layer = next(iter(get_layers_from_vllm_config(self.runner.vllm_config, Attention).values()))
        impl: Any = layer.impl
        original = impl.do_kv_cache_update

        def with_padding(layer_: Any, key: Any, value: Any, kv_cache: Any, slots: Any) -> None:
            del impl.do_kv_cache_update  # back to the class's method
            # One padding token more, whose slot is a live one instead of -1.
            pad = torch.tensor([slot], dtype=slots.dtype, device=slots.device)
            original(layer_, key[:1] + 1.0, value[:1] + 1.0, kv_cache, pad)
            original(layer_, key, value, kv_cache, slots)

        impl.do_kv_cache_update = with_padding
        return self._record(Fault.PADDING_WRITE, request.request_id, f"slot {slot}")
