"""Host time of each phase of the canary runtime's step, without a profiler.

cProfile and torch.profiler inflate a step about 1.75x and move its costs around; this
wraps the runtime's methods, the launchers' two halves (``validate_*_args`` and
``dispatch_*``) and the adapter's hooks in ``perf_counter`` wrappers (a fraction of a
microsecond each), so that a probe can say where a step's host time goes at its own
speed, inside an engine or not. Used by ``runtime_host --phases`` and ``engine_share
--phases``; the wrappers stay until :meth:`Phases.remove`.

Times are inclusive (``_prepare`` holds ``Staging.stage``, the launches hold their halves);
per step kind (``prefill``: some row of the batch ``begin_step`` took writes more than one
token; ``decode``), means over the steps of that kind. The table indents each phase under
the method that calls it on a step that does not overlap: on a step where
``overlap_begin`` holds the batch (the prefill steps by default), ``_prepare`` and what it
calls run inside ``end_step`` instead, so their time lies in ``end_step``'s there.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections import defaultdict
from typing import Any

from benchmarks.harness import markdown_table

TARGETS: tuple[tuple[str, str, str], ...] = (
    # (module, attribute path inside it, label)
    ("kv_canary_engines.transformers", "TransformersCanary._pre_forward", "adapter pre_forward"),
    ("kv_canary_engines.transformers", "TransformersCanary._post_forward", "adapter post_forward"),
    ("kv_canary_engines.runtime", "CanaryRuntime.begin_step", "begin_step"),
    ("kv_canary_engines.runtime", "CanaryRuntime._prepare", "  _prepare"),
    ("kv_canary_engines.runtime", "CanaryRuntime._check_tables", "    _check_tables"),
    ("kv_canary_engines.runtime", "CanaryRuntime._pool_gaps", "    _pool_gaps"),
    ("kv_canary_engines.runtime", "CanaryRuntime._grow_tables", "    _grow_tables"),
    ("kv_canary_engines.runtime", "CanaryRuntime._table_index", "    _table_index"),
    ("kv_canary_engines.host", "Staging.stage", "    Staging.stage"),
    ("kv_canary_engines.host", "to_device", "      to_device (a new layout)"),
    ("kv_canary_engines.runtime", "CanaryRuntime._load_table", "    _load_table"),
    ("kv_canary_engines.runtime", "_flat_inputs", "    _flat_inputs"),
    ("kv_canary_engines.runtime", "_flat", "    _flat"),
    ("kv_canary_engines.runtime", "CanaryRuntime._chains", "    _chains"),
    ("kv_canary_engines.runtime", "CanaryRuntime.end_step", "end_step"),
    ("kv_canary_engines.runtime", "CanaryRuntime._write", "  _write"),
    ("kv_canary_engines.runtime", "CanaryRuntime._write_pair", "  _write_pair"),
    ("kv_canary_engines.runtime", "CanaryRuntime._stamp", "  _stamp"),
    ("kv_canary_engines.runtime", "CanaryRuntime._verify", "  _verify (both)"),
    ("kv_canary_engines.runtime", "CanaryRuntime.poll", "  poll"),
    ("kv_canary_engines.rows", "RowTable.stamped", "  rows.stamped"),
    ("kv_canary_engines.timing", "StepTiming.mark", "timing.mark"),
    ("kv_canary_engines.rows", "RowTable.missing", "rows.missing"),
    ("kv_canary_engines.runtime", "_check_token_ids", "_check_token_ids"),
    ("kv_canary_kernels.tables", "validate_load_token_slots_args", "validate_load_slots"),
    ("kv_canary_kernels.tables", "validate_step_parts", "validate_step_parts"),
    ("kv_canary_kernels.launch", "validate_plan_args", "validate_plan_args"),
    ("kv_canary_kernels.launch", "dispatch_plan", "dispatch_plan"),
    ("kv_canary_kernels.launch", "validate_verify_args", "validate_verify_args"),
    ("kv_canary_kernels.launch", "dispatch_verify", "dispatch_verify"),
    ("kv_canary_kernels.launch", "validate_write_args", "validate_write_args"),
    ("kv_canary_kernels.launch", "dispatch_write", "dispatch_write"),
    ("kv_canary_kernels.launch", "validate_write_pair_args", "validate_write_pair_args"),
    ("kv_canary_kernels.launch", "dispatch_write_pair", "dispatch_write_pair"),
    ("kv_canary_kernels.launch", "validate_write_chain_args", "validate_write_chain_args"),
    ("kv_canary_kernels.launch", "dispatch_write_chain", "dispatch_write_chain"),
    ("kv_canary_kernels.launch", "validate_write_stamp_args", "validate_write_stamp_args"),
    ("kv_canary_kernels.launch", "dispatch_write_stamp", "dispatch_write_stamp"),
)


class Phases:
    """The installed wrappers and what they measured."""

    _installed = False
    """One set of wrappers at a time (a second would time the first one's wrappers)."""

    def __init__(self, module: str = "kv_canary_engines") -> None:
        if Phases._installed:
            raise RuntimeError("kv-canary: benchmarks.phases: Phases() is already installed")
        self.seconds: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.calls: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.kind = "decode"
        self._undo: list[tuple[Any, str, Any]] = []
        for mod_name, path, label in TARGETS:
            mod_name = mod_name.replace("kv_canary_engines", module, 1)
            owner: Any = importlib.import_module(mod_name)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            if not hasattr(owner, name):
                if module == "kv_canary_engines":  # a renamed phase: say so, never drop it
                    raise AttributeError(f"kv-canary: benchmarks.phases: no {mod_name}.{path}")
                continue  # an older revision's copy may predate a phase
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            if isinstance(original, (staticmethod, classmethod)):
                raise TypeError(f"kv-canary: benchmarks.phases: {path} is not a plain function")
            setattr(owner, name, self._timed(original, label))
            self._undo.append((owner, name, original))
        Phases._installed = True

    def _timed(self, fn: Any, label: str) -> Any:
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter
        begin = label == "begin_step"

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if begin:  # the step's kind, from its batch (args: the runtime, the batch)
                batch = args[1] if len(args) > 1 else kwargs.get("batch")
                rows = getattr(batch, "rows", ())
                self.kind = "prefill" if any(r.extend_len > 1 for r in rows) else "decode"
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                key = (self.kind, label)
                seconds[key] += clock() - t0
                calls[key] += 1

        return timed

    def remove(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        Phases._installed = False

    def table(self) -> str:
        """Per step kind and label: calls a step and host us a step (means over the steps
        of that kind), in :data:`TARGETS`' order."""
        rows = []
        for kind in ("decode", "prefill"):
            steps = self.calls.get((kind, "begin_step"), 0)
            for _, _, label in TARGETS:
                calls = self.calls.get((kind, label), 0)
                if steps and calls:
                    us = 1e6 * self.seconds[(kind, label)] / steps
                    rows.append([kind, label, f"{calls / steps:.2f}", f"{us:.1f}"])
        return markdown_table(["step", "phase", "calls a step", "host us a step"], rows)
