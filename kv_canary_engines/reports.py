"""What a poll returns: each violation row mapped to the engine's request ids, the status
words, the health check, and the one-line log format.

Launch tags encode where a row came from: ``(step << 8) | (group << 4) | endpoint`` (see
:func:`launch_tag`), so a row read back several steps later still names the step, the KV
group and the endpoint (HEAD verify, HEAD write, TAIL write, TAIL verify, sweep) that saw
it, and the runtime maps its plan row to the request that held that row at that step.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence

import attrs

from kv_canary_buffers import CanaryStatus, PlanStatus, Violation

RequestId = Hashable
"""An engine's request id (transformers and vLLM use strings)."""


class Endpoint(enum.IntEnum):
    """The launch a violation row came from (the low 4 bits of its launch tag)."""

    HEAD_VERIFY = 0
    HEAD_WRITE = 1
    TAIL_WRITE = 2
    TAIL_VERIFY = 3
    SWEEP = 4


_GROUP_BITS = 4
_ENDPOINT_BITS = 4
MAX_GROUPS = 1 << _GROUP_BITS


def launch_tag(step: int, group: int, endpoint: Endpoint) -> int:
    """The launch tag of one launch: ``(step << 8) | (group << 4) | endpoint``."""
    return (step << (_GROUP_BITS + _ENDPOINT_BITS)) | (group << _ENDPOINT_BITS) | int(endpoint)


def decode_tag(tag: int) -> tuple[int, int, Endpoint | None]:
    """``(step, group, endpoint)`` of a launch tag (endpoint None for a tag the runtime
    never wrote)."""
    low = tag & ((1 << _ENDPOINT_BITS) - 1)
    group = (tag >> _ENDPOINT_BITS) & ((1 << _GROUP_BITS) - 1)
    endpoint = Endpoint(low) if low in Endpoint._value2member_map_ else None
    return tag >> (_GROUP_BITS + _ENDPOINT_BITS), group, endpoint


@attrs.frozen(kw_only=True)
class EngineViolation:
    """One violation row with the engine's names for what it concerns.

    Attributes:
        violation: the library's decoded row.
        group: the KV group's name.
        endpoint: the launch that appended it.
        step: the runtime step of that launch.
        request_id: the victim, the request of the plan row the row concerns (None when
            the library's report does not say, see ``holders``).
        culprit_id: the request that last wrote the slot, when the library records it and
            it is not the victim (None otherwise).
        holders: when the row names no plan row: every request whose tables held the
            slot in that step (victims and culprits alike).
        line: the one-line log form: the library's (SGLang's frozen key=value format,
            ``Violation.log_line``), then :func:`engine_suffix`.
    """

    violation: Violation
    group: str
    endpoint: Endpoint | None
    step: int
    request_id: RequestId | None
    culprit_id: RequestId | None
    holders: tuple[RequestId, ...]
    line: str

    def request_ids(self) -> frozenset[RequestId]:
        """The requests to act on for this row: victim, culprit and slot holders."""
        ids = set(self.holders)
        for rid in (self.request_id, self.culprit_id):
            if rid is not None:
                ids.add(rid)
        return frozenset(ids)


@attrs.frozen(kw_only=True)
class Health:
    """Whether the canary's launches ran: each store's ``kernel_runs`` advanced by the
    launches the runtime made since the previous poll."""

    executing: bool = True
    message: str = "kv-canary: executing"


@attrs.frozen(kw_only=True)
class CanaryReport:
    """What one poll read back (a sync), for every KV group and store.

    Attributes:
        step: the runtime step the poll followed (steps ``0 .. step - 1`` have run).
        violations: every kept row, attributed.
        appended: rows appended since the previous poll, dropped ones included.
        dropped: rows lost to a full ring.
        plan_status: ``{group: PlanStatus}`` bits since the previous poll (step and sweep
            plans).
        canary_status: ``{"group/HEAD" or "group/TAIL": CanaryStatus}``.
        health: the execution check.
    """

    step: int
    violations: tuple[EngineViolation, ...]
    appended: int
    dropped: int
    plan_status: dict[str, PlanStatus]
    canary_status: dict[str, CanaryStatus]
    health: Health

    def __bool__(self) -> bool:
        """True when a violation row was appended (kept or dropped)."""
        return self.appended > 0

    def request_ids(self) -> frozenset[RequestId]:
        """Every request a violation names (victims, culprits, slot holders): the requests
        to abort."""
        ids: set[RequestId] = set()
        for v in self.violations:
            ids |= v.request_ids()
        return frozenset(ids)

    @property
    def flags(self) -> bool:
        """True when a plan or store status word is not OK (data the kernels refused)."""
        return any(self.plan_status.values()) or any(self.canary_status.values())

    def log_lines(self) -> list[str]:
        """One line per kept violation row (``EngineViolation.line``)."""
        return [v.line for v in self.violations]

    def __str__(self) -> str:
        if not self.appended:
            return f"kv-canary: no violations up to step {self.step}"
        dropped = f", {self.dropped} dropped (ring full)" if self.dropped else ""
        ids = ", ".join(sorted(map(str, self.request_ids())))
        return (
            f"kv-canary: {self.appended} violation(s){dropped} up to step {self.step}; "
            f"requests: {ids or '(unknown)'}"
        )


class CanaryViolationError(RuntimeError):
    """Raised by the ``raise`` policy: the message names the requests, ``report`` holds
    everything the poll read."""

    def __init__(self, report: CanaryReport) -> None:
        super().__init__(str(report))
        self.report = report


def engine_suffix(
    *,
    group: str,
    endpoint: Endpoint | None,
    step: int,
    request_id: RequestId | None,
    culprit_id: RequestId | None,
    holders: Sequence[RequestId],
) -> str:
    """The runtime's fields after SGLang's: where the row came from and which requests it
    names."""
    parts = [
        f"group={group}",
        f"endpoint={endpoint.name if endpoint is not None else 'unknown'}",
        f"step={step}",
        f"request_id={request_id if request_id is not None else '-'}",
        f"culprit_request_id={culprit_id if culprit_id is not None else '-'}",
    ]
    if holders:
        parts.append("slot_holders=" + ",".join(map(str, holders)))
    return " ".join(parts)
