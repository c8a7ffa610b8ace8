"""The shadow checks: every plan against the contract's invariants and ``plan_reference``
(into each group's ``oracle`` buffers) and, when the kernels run, reference stores fed the
same inputs by the torch references, compared with the kernels' stores every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from kv_canary_buffers import (
    CanaryStore,
    Violation,
    ViolationReport,
    plan_reference,
    plans_equal,
    verify_entries_needed,
    verify_reference,
    write_reference,
)

from .config import SimConfig, Stats
from .step import Group, plain_tokens, tag


class Shadow:
    """Counts what differs in ``stats`` (``plan_mismatches``, ``store_mismatches``)."""

    def __init__(
        self, config: SimConfig, *, device: torch.device, stats: Stats, say: Callable[[str], None]
    ):
        self.config = config
        self.device = device
        self.stats = stats
        self.say = say

    def check_plan(
        self,
        g: Group,
        kwargs: dict[str, Any],
        host: dict[str, list[int]],
        total: int,
        overflow: bool,
    ) -> None:
        """The plan in ``g.buffers`` (its launch's keyword arguments ``kwargs``; ``total``
        verify entries, counted on the host, ``overflow`` past the capacity) against the
        contract's invariants and ``plan_reference``."""
        bs = kwargs["req_pool_indices"].shape[0]
        b = g.buffers
        offsets = b.write_offsets
        ok = int(offsets[0]) == 0 and bool((offsets[1 : bs + 1] >= offsets[:bs]).all())
        ok &= bool((offsets[bs + 1 :] == 0).all()) and int(b.write_num_valid_reqs) == bs
        ok &= int(b.verify_enable) == (0 if overflow else 1)
        ok &= int(b.verify_num_valid) == (b.verify_capacity if overflow else total)
        if not overflow and total:
            # within a row, positions ascend by one and each entry's predecessor is
            # the entry before it (each row's count: the same helper, row by row)
            counts = [
                verify_entries_needed([p], req_pool_indices=[r], swa_window_size=g.window)
                for r, p in zip(host["req_pool_indices"], host["prefix_lens"])
            ]
            # (rows of the scheduler's lists only: a captured plan's padding rows, past
            # them, have no entries)
            row = torch.repeat_interleave(
                torch.arange(len(counts)), torch.tensor(counts, dtype=torch.int64)
            ).to(self.device)
            same_row = row[1:] == row[:-1]
            pos = b.verify_expected_positions[:total]
            prev = b.verify_prev_slot_indices[1:total]
            ok &= bool((pos[1:][same_row] == pos[:-1][same_row] + 1).all())
            ok &= bool((prev[same_row] == b.verify_slot_indices[: total - 1][same_row]).all())
        if self.config.graphs:  # the staging is linked to g.buffers: the oracle plans copies
            assert g.staging is not None
            staged = g.staging.plan_kwargs(with_valid_lens=True)
            kwargs = dict(kwargs, **{k: t.clone() for k, t in staged.items()})
        plan_reference(g.oracle, **kwargs)
        ok &= plans_equal(b, g.oracle, bs)
        if not ok:
            self.stats.plan_mismatches += 1
            self.say(f"{g.name}: the plan differs from plan_reference")

    def pre(self, groups: Sequence[Group]) -> None:
        """The HEAD verify, on the shadow stores with the oracle's plan."""
        for g in groups:
            if g.shadow_head is not None:
                verify_reference(
                    g.shadow_head,
                    g.oracle,
                    launch_tag=tag(g.name, "HEAD_VERIFY"),
                    real_kv=g.real_kv,
                )

    def post(
        self, groups: Sequence[Group], group_tokens: dict[str, dict[str, torch.Tensor]]
    ) -> None:
        """The writes and TAIL verify, on the shadow stores with the oracle's plan."""
        for g in groups:
            if g.shadow_head is None:
                continue
            tokens = group_tokens[g.name]
            write_reference(
                g.shadow_head,
                g.oracle,
                launch_tag=tag(g.name, "HEAD_WRITE"),
                real_kv=g.real_kv,
                **tokens,
            )
            if g.shadow_tail is not None:
                write_reference(
                    g.shadow_tail,
                    g.oracle,
                    launch_tag=tag(g.name, "TAIL_WRITE"),
                    real_kv=g.real_kv,
                    **plain_tokens(tokens),
                )
                verify_reference(
                    g.shadow_tail,
                    g.oracle,
                    launch_tag=tag(g.name, "TAIL_VERIFY"),
                    real_kv=g.real_kv,
                )

    def compare_store(
        self,
        g: Group,
        name: str,
        store: CanaryStore,
        shadow: CanaryStore,
        report: ViolationReport,
    ) -> None:
        """The store's violations (``report``, just taken), counters and records against
        its shadow's."""
        ref = shadow.take_violations()
        same = (
            _rows_sorted(report.violations) == _rows_sorted(ref.violations)
            and (report.appended, report.kernel_runs, report.slots_processed)
            == (ref.appended, ref.kernel_runs, ref.slots_processed)
            and torch.equal(store.records, shadow.records)
        )
        if not same:
            self.stats.store_mismatches += 1
            self.say(f"{name} {g.name} store differs from its reference store")


def _rows_sorted(violations: Sequence[Violation]) -> list[tuple[object, ...]]:
    return sorted(attrs.astuple(v, recurse=False) for v in violations)
