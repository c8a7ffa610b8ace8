"""``python -m kv_canary_buffers decode FILE``: the decoded rows and counters of a saved
store (:meth:`CanaryStore.save`) or of a report saved as JSON
(``json.dump(report.to_dict(), f)``), read on the CPU.

``--format text`` (default) prints the report as ``str(report)`` does, every row listed;
``log`` prints SGLang's key=value line per row (:meth:`ViolationReport.log_lines`);
``json`` prints :meth:`ViolationReport.to_dict` (and, for a store, its sizes and status).
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import ViolationReport
from .status import CanaryStatus
from .store import CanaryStore


def read(path: Path) -> tuple[ViolationReport, dict[str, Any]]:
    """The report held by ``path`` and what else it says (a store's sizes, generation and
    status). Raises ``ValueError`` (``kv-canary:``) for a file that is neither."""
    if zipfile.is_zipfile(path):  # what torch.save writes
        store = CanaryStore.load(path, device="cpu")
        about: dict[str, Any] = {
            "num_slots": store.num_slots,
            "violation_capacity": store.violation_capacity,
            "generation": store.generation,
            "status": store.take_status(),
        }
        return store.take_violations(), about
    try:
        data = json.loads(path.read_text())
        return ViolationReport.from_dict(data), {}
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError(
            f"kv-canary: FILE must be a store saved by CanaryStore.save or a report saved as "
            f"JSON by ViolationReport.to_dict, got {path}"
        ) from None


def render(report: ViolationReport, about: dict[str, Any], fmt: str) -> str:
    """The text ``decode`` prints for one file."""
    if fmt == "json":
        status = about.get("status")
        out = {**about, "report": report.to_dict()}
        if status is not None:
            out["status"] = [bit.name for bit in CanaryStatus if bit and bit in status]
        return json.dumps(out, indent=2)
    if fmt == "log":
        return "\n".join(report.log_lines())
    lines = []
    if about:
        status = about["status"]
        names = "|".join(b.name or "" for b in CanaryStatus if b and b in status) or "OK"
        lines.append(
            f"CanaryStore: num_slots={about['num_slots']} "
            f"violation_capacity={about['violation_capacity']} "
            f"generation={about['generation']} status={names}"
        )
    head = str(report).splitlines()[0]
    lines.append(head)
    lines.extend(f"  {v}" for v in report.violations)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kv_canary_buffers decode", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("file", type=Path, help="a saved store or a JSON report")
    parser.add_argument("--format", choices=("text", "log", "json"), default="text")
    args = parser.parse_args(argv)
    try:
        report, about = read(args.file)
    except (OSError, ValueError) as err:
        print(err if str(err).startswith("kv-canary:") else f"kv-canary: {err}", file=sys.stderr)
        return 2
    print(render(report, about, args.format))
    return 0
