"""Prometheus counters of the canary, updated from the reports an engine already polls
(no read of the device of their own, so no extra sync). Optional: ``prometheus_client``
is the ``metrics`` extra (``pip install 'kv-canary-buffers[metrics]'``), imported only
when a :class:`CanaryMetrics` is built.

Counters (``namespace`` prefix, default ``kv_canary``), each labelled by ``store`` (the
name the engine gives each store: ``head/full``, ``tail/swa``, ...):

- ``violations_total{store, fail_reason, launch_tag}``: kept ring rows, one per fail bit
  a row carries (``fail_reason`` as SGLang's labels: ``verify_chain_hash``, ...);
- ``ring_rows_dropped_total{store}``: rows lost because the ring was full;
- ``kernel_runs_total{store}``, ``slots_processed_total{store}``: the store's own
  counters (cumulative on the device; the increase since the last report of that store
  is added);
- ``verify_skipped_total{store}``: verify calls that checked nothing (the plan overflowed,
  or was built without verify entries): the store's ``verify_skipped`` counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .report import ViolationReport, reason_label
from .status import FailBits


class CanaryMetrics:
    """The canary's Prometheus counters, in ``registry`` (``prometheus_client``'s default
    registry when None).

    Call :meth:`observe` with each report the engine takes (``store.take_violations()``),
    naming its store. ``tag_names`` names launch tags in the ``launch_tag`` label (a tag
    without a name is its number)."""

    def __init__(
        self,
        *,
        registry: Any = None,
        namespace: str = "kv_canary",
        tag_names: Mapping[int, str] | None = None,
    ) -> None:
        try:
            import prometheus_client
        except ImportError:
            raise ImportError(
                "kv-canary: CanaryMetrics needs prometheus_client, got none installed "
                "(pip install 'kv-canary-buffers[metrics]')"
            ) from None
        counter = prometheus_client.Counter
        kw: dict[str, Any] = {"namespace": namespace}
        if registry is not None:
            kw["registry"] = registry
        self._violations = counter(
            "violations",
            "Violation rows kept in a store's ring, one per fail bit of a row",
            ["store", "fail_reason", "launch_tag"],
            **kw,
        )
        self._dropped = counter(
            "ring_rows_dropped", "Violation rows lost because the ring was full", ["store"], **kw
        )
        self._runs = counter("kernel_runs", "Write and verify calls on a store", ["store"], **kw)
        self._slots = counter(
            "slots_processed",
            "Records written plus verify entries looked at on a store",
            ["store"],
            **kw,
        )
        self._skipped = counter(
            "verify_skipped",
            "Verify calls that checked nothing: the plan overflowed or had no verify entries",
            ["store"],
            **kw,
        )
        self._tag_names = dict(tag_names or {})
        self._last: dict[str, tuple[int, int, int]] = {}

    def observe(self, report: ViolationReport, *, store: str) -> None:
        """Add what ``report`` (one ``take_violations`` of the store named ``store``) says
        to the counters."""
        for v in report.violations:
            tag = self._tag_names.get(v.launch_tag, str(v.launch_tag))
            for bit in FailBits:
                if bit and bit in v.fail_bits:
                    self._violations.labels(store, reason_label(bit), tag).inc()
        if report.dropped:
            self._dropped.labels(store).inc(report.dropped)
        skipped = report.verify_skipped
        runs0, slots0, skipped0 = self._last.get(store, (0, 0, 0))
        # The store's counters are cumulative: add the increase (a new store under the
        # same name, whose counters start again, adds its own count).
        for metric, now, before in (
            (self._runs, report.kernel_runs, runs0),
            (self._slots, report.slots_processed, slots0),
            (self._skipped, skipped, skipped0),
        ):
            metric.labels(store).inc(now - before if now >= before else now)
        self._last[store] = (report.kernel_runs, report.slots_processed, skipped)
