"""Violation reports: the rows of a store's violation ring, decoded for people and logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .hashing import to_unsigned
from .layout import VIOLATION_COLUMNS
from .status import FailBits


@attrs.frozen(kw_only=True)
class Violation:
    """One violation row (docs/contract.md, "Violation ring"), decoded.

    ``expected_aux`` is the expected chain hash for verify rows (``CHAIN``,
    ``POSITION``, ``REAL_KV``, ``VERIFY_TOKEN``) and the expected position for write rows
    (``WRITE_TOKEN``, ``WRITE_POSITION``); ``stored_chain_hash`` is the record's chain hash
    (verify) or the running chain hash the write stamped (write)."""

    launch_tag: int
    slot: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int
    fail_bits: FailBits

    @classmethod
    def from_row(cls, row: Sequence[int]) -> Violation:
        """Decode one int64 ``[8]`` row given as ints."""
        values: dict[str, Any] = dict(zip(VIOLATION_COLUMNS, (int(v) for v in row)))
        values["fail_bits"] = FailBits(values["fail_bits"] & int(_ALL_BITS))
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
        return (
            f"[{names}] tag {self.launch_tag} slot {self.slot} position {self.position}: "
            f"token {self.stored_token} (expected {self.expected_token}), "
            f"chain {to_unsigned(self.stored_chain_hash):#018x}, {aux}"
        )


_ALL_BITS = FailBits(sum(FailBits))


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
    """

    violations: tuple[Violation, ...]
    appended: int
    dropped: int
    kernel_runs: int
    slots_processed: int

    def __bool__(self) -> bool:
        """True when anything was appended (kept or dropped)."""
        return self.appended > 0

    def count_by_bits(self) -> dict[FailBits, int]:
        """``{FailBits flag: rows carrying it}`` over the kept rows."""
        counts: dict[FailBits, int] = {}
        for v in self.violations:
            for bit in FailBits:
                if bit and bit in v.fail_bits:
                    counts[bit] = counts.get(bit, 0) + 1
        return counts

    def __str__(self) -> str:
        dropped = f", {self.dropped} dropped (ring full)" if self.dropped else ""
        head = (
            f"kv-canary: {self.appended} violation(s){dropped}; "
            f"{self.kernel_runs} kernel runs, {self.slots_processed} slots processed"
        )
        if not self.appended:
            return (
                f"kv-canary: no violations; {self.kernel_runs} kernel runs, "
                f"{self.slots_processed} slots processed"
            )
        shown = self.violations[:_SHOWN]
        lines = [head] + [f"  {v}" for v in shown]
        if len(self.violations) > len(shown):
            lines.append(f"  ... {len(self.violations) - len(shown)} more")
        return "\n".join(lines)


_SHOWN = 20
"""Rows a report's ``str()`` lists; the rest are counted."""
