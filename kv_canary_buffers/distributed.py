"""One violation report for a tensor-parallel engine: every rank's, gathered.

Each rank of a tensor-parallel engine owns its own stores (one process per GPU) and takes
its own :class:`ViolationReport` with :meth:`CanaryStore.take_violations`. Then every rank
calls :func:`gather_violation_reports` with its report: a collective over
``torch.distributed`` (initialised by the engine; gloo or NCCL) that returns, on the
destination rank, every rank's violations tagged with their rank and the counts summed.

Cost: one small collective (an all-gather of six int64 per rank) when no rank has a
violation row to send, which is the common case; one more all-gather of the rows (the
eight ring columns and the three of their context), padded to the longest rank's, when
some do. Call it outside CUDA graphs, where the engine reads
the reports (every N steps, say): it synchronizes like ``take_violations``.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from .checks import check_index
from .layout import CONTEXT_COLUMNS, RECORD_DTYPE, VIOLATION_COLUMNS
from .report import Violation, ViolationReport

_COLUMNS = (*VIOLATION_COLUMNS, *CONTEXT_COLUMNS)
"""What crosses the ranks per row: the ring's columns, then the context's (the owner as
decoded, ``-1`` when unknown)."""


@attrs.frozen(kw_only=True)
class RankedViolation:
    """A violation row and the rank whose store appended it."""

    rank: int
    violation: Violation

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.violation}"


@attrs.frozen(kw_only=True)
class GatheredReport:
    """Every rank's violations and counters, as :func:`gather_violation_reports` returns.

    Attributes:
        violations: the rows of every rank, rank by rank, each tagged with its rank.
        appended, dropped, kernel_runs, slots_processed, verify_skipped: the ranks'
            counts, summed.
        per_rank: each rank's own report, in rank order.
    """

    violations: tuple[RankedViolation, ...]
    appended: int
    dropped: int
    kernel_runs: int
    slots_processed: int
    verify_skipped: int
    per_rank: tuple[ViolationReport, ...]

    def __bool__(self) -> bool:
        return self.appended > 0

    def req_pool_indices(self) -> tuple[int, ...]:
        """The requests to act on over every rank (:meth:`ViolationReport.req_pool_indices`
        of each rank's report, merged): the ranks of a tensor-parallel engine share one
        scheduler, so one request index means one request on every rank."""
        return tuple(sorted({i for r in self.per_rank for i in r.req_pool_indices()}))

    def __str__(self) -> str:
        ranks = len(self.per_rank)
        skipped = (
            f", {self.verify_skipped} verify call(s) skipped (checked nothing)"
            if self.verify_skipped
            else ""
        )
        counts = f"{self.kernel_runs} kernel runs, {self.slots_processed} slots processed"
        if not self.appended:
            return f"kv-canary: no violations on {ranks} rank(s); {counts}{skipped}"
        dropped = f", {self.dropped} dropped (ring full)" if self.dropped else ""
        requests = self.req_pool_indices()
        lines = [
            f"kv-canary: {self.appended} violation(s) on {ranks} rank(s){dropped}; "
            f"{counts}{skipped}"
            + (f"; requests {', '.join(map(str, requests))}" if requests else "")
        ]
        lines += [f"  {v}" for v in self.violations[:_SHOWN]]
        if len(self.violations) > _SHOWN:
            lines.append(f"  ... {len(self.violations) - _SHOWN} more")
        return "\n".join(lines)


_SHOWN = 20


def _collective_device(group: Any) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_violation_reports(
    report: ViolationReport, *, group: Any = None, dst: int | None = 0
) -> GatheredReport | None:
    """Gather every rank's ``report`` (from :meth:`CanaryStore.take_violations`).

    A collective: every rank of ``group`` (default: the world) must call it. Returns the
    :class:`GatheredReport` on rank ``dst`` (a rank of the default group), or on every rank
    when ``dst`` is None, and None elsewhere. Safe when only some ranks have violations;
    one small all-gather when none has. With NCCL the collective runs on the current CUDA
    device, with gloo on the CPU.

    Raises:
        TypeError: ``report`` is not a :class:`ViolationReport`, or ``dst`` is neither
            None nor an integer.
        ValueError: ``dst`` is negative or not a rank of the default group.
        RuntimeError: ``torch.distributed`` is not initialised.
    """
    import torch.distributed as dist

    if type(report) is not ViolationReport:
        raise TypeError(
            "kv-canary: report must be a kv_canary_buffers.ViolationReport (from "
            f"CanaryStore.take_violations()), got {type(report).__name__}"
        )
    if dst is not None:
        dst = check_index("dst", dst)
        if dst < 0:
            raise ValueError(f"kv-canary: dst must be a rank >= 0 or None, got {dst}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "kv-canary: gather_violation_reports needs torch.distributed initialised by the "
            "engine (torch.distributed.init_process_group), got no process group"
        )
    if dst is not None and dst >= dist.get_world_size():
        raise ValueError(
            f"kv-canary: dst must be a rank of the default group, in [0, "
            f"{dist.get_world_size()}), or None, got {dst}"
        )
    device = _collective_device(group)
    world = dist.get_world_size(group)
    kept = len(report.violations)
    mine = torch.tensor(
        [
            report.appended,
            report.dropped,
            report.kernel_runs,
            report.slots_processed,
            report.verify_skipped,
            kept,
        ],
        dtype=RECORD_DTYPE,
        device=device,
    )
    counts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(counts, mine, group=group)
    per_rank_counts = [c.tolist() for c in counts]
    longest = max(c[5] for c in per_rank_counts)
    rows: list[list[list[int]]] = [[] for _ in range(world)]
    if longest:
        own = torch.zeros(longest, len(_COLUMNS), dtype=RECORD_DTYPE)
        if kept:
            own[:kept] = torch.tensor(
                [[int(getattr(v, c)) for c in _COLUMNS] for v in report.violations],
                dtype=RECORD_DTYPE,
            )
        own = own.to(device)
        gathered = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(gathered, own, group=group)
        rows = [g[: c[5]].tolist() for g, c in zip(gathered, per_rank_counts)]
    if dst is not None and dist.get_rank() != dst:
        return None
    ring = len(VIOLATION_COLUMNS)
    per_rank = tuple(
        ViolationReport(
            violations=tuple(Violation.from_row(r[:ring], context=r[ring:]) for r in rank_rows),
            appended=c[0],
            dropped=c[1],
            kernel_runs=c[2],
            slots_processed=c[3],
            verify_skipped=c[4],
        )
        for c, rank_rows in zip(per_rank_counts, rows)
    )
    return GatheredReport(
        violations=tuple(
            RankedViolation(rank=rank, violation=v)
            for rank, r in enumerate(per_rank)
            for v in r.violations
        ),
        appended=sum(r.appended for r in per_rank),
        dropped=sum(r.dropped for r in per_rank),
        kernel_runs=sum(r.kernel_runs for r in per_rank),
        slots_processed=sum(r.slots_processed for r in per_rank),
        verify_skipped=sum(r.verify_skipped for r in per_rank),
        per_rank=per_rank,
    )
