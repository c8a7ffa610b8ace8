"""Violation reports: the rows of a store's violation ring, decoded for people, logs and
JSON.

Log lines follow SGLang's frozen ``kv_canary violation: launch_tag=... fail_reason=a+b
slot_idx=... position=... stored_token=... expected_token=... stored_chain_hash=0x...
expected_aux=0x...`` key=value format (what its log parsers match), SGLang's reason
labels included; this project's own fields follow them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .hashing import to_unsigned
from .layout import CONTEXT_COLUMNS, VIOLATION_COLUMNS
from .status import FailBits

UNKNOWN_OWNER = -1
"""``Violation.owner`` of a slot the canary never wrote (its ``owners`` entry is 0)."""


@attrs.frozen(kw_only=True)
class Violation:
    """One violation row (docs/contract-canary.md, "Violation ring"), decoded: SGLang's
    eight ring columns, then this project's context of the row.

    ``expected_aux`` is the expected chain hash for verify rows (``CHAIN``,
    ``POSITION``, ``REAL_KV``, ``VERIFY_TOKEN``) and the expected position for write rows
    (``WRITE_TOKEN``, ``WRITE_POSITION``); ``stored_chain_hash`` is the record's chain hash
    (verify) or the running chain hash the write stamped (write). ``position`` is the
    record's position (verify: what the slot's last writer stamped) or the written one.

    The context (``violation_context``): ``req_pool_index`` is the request of the plan
    row the violation concerns (verify: the victim, whose prefix holds the slot; write: the
    writing row), ``expected_position`` the position that row expected there, and
    ``owner`` the request that last wrote the slot (verify: the culprit when it is not
    ``req_pool_index``; write: the writing row), ``-1`` when unknown (a slot the canary
    never wrote). A row without context (SGLang's ring, a store saved before version 2)
    decodes as a zeroed one: request 0, expected position 0, owner -1."""

    launch_tag: int
    slot: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int
    fail_bits: FailBits
    req_pool_index: int = 0
    expected_position: int = 0
    owner: int = UNKNOWN_OWNER

    @classmethod
    def from_row(cls, row: Sequence[int], context: Sequence[int] | None = None) -> Violation:
        """Decode one int64 ``[8]`` ring row given as ints, with its ``[3]`` context row
        (``req_pool_index, expected_position, owner``; None: a zeroed one). An owner of
        ``0`` (a slot the canary never wrote) decodes as ``-1``."""
        values: dict[str, Any] = dict(zip(VIOLATION_COLUMNS, (int(v) for v in row)))
        values["fail_bits"] = FailBits(values["fail_bits"] & int(_ALL_BITS))
        if context is not None:
            values.update(zip(CONTEXT_COLUMNS, (int(v) for v in context)))
            if values["owner"] == 0:
                values["owner"] = UNKNOWN_OWNER
        return cls(**values)

    @property
    def is_write(self) -> bool:
        """Whether the write stage appended this row (else verify did)."""
        return bool(self.fail_bits & (FailBits.WRITE_TOKEN | FailBits.WRITE_POSITION))

    def __str__(self) -> str:
        names = "|".join(bit.name or "" for bit in FailBits if bit and bit in self.fail_bits)
        aux = (
            f"expected position {self.expected_aux}"
            if self.is_write
            else f"expected chain {to_unsigned(self.expected_aux):#018x}"
        )
        owner = "unknown" if self.owner == UNKNOWN_OWNER else str(self.owner)
        who = (
            f"written by request {self.req_pool_index}"
            if self.is_write
            else f"request {self.req_pool_index} expected position {self.expected_position}, "
            f"slot last written by request {owner}"
        )
        return (
            f"[{names}] tag {self.launch_tag} slot {self.slot} position {self.position}: "
            f"token {self.stored_token} (expected {self.expected_token}), "
            f"chain {to_unsigned(self.stored_chain_hash):#018x}, {aux}; {who}"
        )

    def log_line(self, tag_names: Mapping[int, str] | None = None) -> str:
        """This row as one line of SGLang's frozen key=value format, then this project's
        own fields (``key=value``, after SGLang's). ``tag_names`` names launch tags
        (``launch_tag=HEAD_FULL``); a tag without a name is written as its number."""
        reasons = [reason_label(bit) for bit in FailBits if bit and bit in self.fail_bits]
        tag = tag_names.get(self.launch_tag) if tag_names is not None else None
        line = (
            "kv_canary violation: "
            f"launch_tag={self.launch_tag if tag is None else tag} "
            f"fail_reason={'+'.join(reasons) if reasons else 'none'} "
            f"slot_idx={self.slot} "
            f"position={self.position} "
            f"stored_token={self.stored_token} "
            f"expected_token={self.expected_token} "
            f"stored_chain_hash={to_unsigned(self.stored_chain_hash):#018x} "
            f"expected_aux={to_unsigned(self.expected_aux):#018x}"
        )
        extra = [f"{name}={getattr(self, name)}" for name in _OWN_FIELDS]
        return " ".join([line, *extra])

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready values (int64 columns as ints, ``fail_bits`` as an
        int, with its names in ``fail_reasons``); :meth:`from_dict` reads it back."""
        out: dict[str, Any] = {f.name: int(getattr(self, f.name)) for f in _FIELDS}
        out["fail_reasons"] = [bit.name for bit in FailBits if bit and bit in self.fail_bits]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Violation:
        """The :class:`Violation` that :meth:`to_dict` wrote (``fail_reasons`` ignored:
        ``fail_bits`` holds them)."""
        values: dict[str, Any] = {f.name: int(data[f.name]) for f in _FIELDS if f.name in data}
        values["fail_bits"] = FailBits(values.get("fail_bits", 0) & int(_ALL_BITS))
        return cls(**values)


_ALL_BITS = FailBits(sum(FailBits))
_FIELDS = attrs.fields(Violation)
_OWN_FIELDS = tuple(f.name for f in _FIELDS if f.name not in (*VIOLATION_COLUMNS, "fail_bits"))
"""The fields this project adds beside SGLang's eight ring columns (written after them in
a log line)."""
_REASON_LABELS = {
    FailBits.CHAIN: "verify_chain_hash",
    FailBits.POSITION: "verify_position",
    FailBits.REAL_KV: "verify_real_kv_hash",
    FailBits.WRITE_TOKEN: "write_token",
    FailBits.WRITE_POSITION: "write_position",
    FailBits.VERIFY_TOKEN: "verify_token",
}
"""SGLang's ``fail_reason`` label of each bit (its ``FailReason`` names, lower case, without
``_mismatch``): log parsers written for SGLang match these."""


def reason_label(bit: FailBits) -> str:
    """SGLang's ``fail_reason`` label of one fail bit (``FailBits.CHAIN`` ->
    ``verify_chain_hash``), as in log lines and metrics."""
    return _REASON_LABELS[bit]


@attrs.frozen(kw_only=True)
class ViolationReport:
    """What :meth:`CanaryStore.take_violations` read from one store.

    Attributes:
        violations: the decoded rows, in ring order (within one launch the kernels'
            order is unspecified).
        appended: rows appended since the last take, dropped ones included.
        dropped: rows lost because the ring was full (``appended - len(violations)``).
        kernel_runs: write and verify calls on this store since allocation.
        slots_processed: records written plus verify entries looked at since allocation.
        verify_skipped: verify calls that checked nothing (an overflowed or write-only
            plan, ``verify_enable = 0``) since allocation: a step whose verify was skipped
            is counted here, never silent.
    """

    violations: tuple[Violation, ...]
    appended: int
    dropped: int
    kernel_runs: int
    slots_processed: int
    verify_skipped: int = 0

    def __bool__(self) -> bool:
        """True when anything was appended (kept or dropped)."""
        return self.appended > 0

    def req_pool_indices(self) -> tuple[int, ...]:
        """The requests to act on (abort, or re-prefill), sorted, each once: every kept
        row's ``req_pool_index`` (the victim of a verify row, the writer of a write row)
        and every known ``owner`` (the slot's last writer: the culprit where it differs).
        Never ``0`` (padding, or no request known)."""
        found = {v.req_pool_index for v in self.violations}
        found.update(v.owner for v in self.violations if v.owner != UNKNOWN_OWNER)
        found.discard(0)
        return tuple(sorted(found))

    def count_by_bits(self) -> dict[FailBits, int]:
        """``{FailBits flag: rows carrying it}`` over the kept rows."""
        counts: dict[FailBits, int] = {}
        for v in self.violations:
            for bit in FailBits:
                if bit and bit in v.fail_bits:
                    counts[bit] = counts.get(bit, 0) + 1
        return counts

    def log_lines(self, tag_names: Mapping[int, str] | None = None) -> list[str]:
        """One line per kept row in SGLang's frozen format (:meth:`Violation.log_line`),
        for ``logging``: ``for line in report.log_lines(): logger.warning(line)``."""
        return [v.log_line(tag_names) for v in self.violations]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``json.dumps(report.to_dict())``): the rows
        (:meth:`Violation.to_dict`) and the counters; :meth:`from_dict` reads it back."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in attrs.fields(ViolationReport)}
        out["violations"] = [v.to_dict() for v in self.violations]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ViolationReport:
        """The :class:`ViolationReport` that :meth:`to_dict` wrote."""
        values = {
            f.name: int(data[f.name])
            for f in attrs.fields(ViolationReport)
            if f.name != "violations" and f.name in data
        }
        rows = tuple(Violation.from_dict(v) for v in data.get("violations", ()))
        return cls(violations=rows, **values)

    def __str__(self) -> str:
        dropped = f", {self.dropped} dropped (ring full)" if self.dropped else ""
        skipped = (
            f", {self.verify_skipped} verify call(s) skipped (checked nothing)"
            if self.verify_skipped
            else ""
        )
        counts = f"{self.kernel_runs} kernel runs, {self.slots_processed} slots processed"
        if not self.appended:
            return f"kv-canary: no violations; {counts}{skipped}"
        head = f"kv-canary: {self.appended} violation(s){dropped}; {counts}{skipped}"
        requests = self.req_pool_indices()
        if requests:
            head += f"; requests {', '.join(map(str, requests))}"
        shown = self.violations[:_SHOWN]
        lines = [head] + [f"  {v}" for v in shown]
        if len(self.violations) > len(shown):
            lines.append(f"  ... {len(self.violations) - len(shown)} more")
        return "\n".join(lines)


_SHOWN = 20
"""Rows a report's ``str()`` lists; the rest are counted."""
