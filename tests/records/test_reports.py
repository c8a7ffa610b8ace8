"""What people and programs read: a report's log lines in SGLang's frozen key=value format
(matched here with the regex SGLang's own log helper uses), its JSON form read back
unchanged, a store saved and loaded (``CanaryStore.save`` / ``load``, ``torch.save``) and
``python -m kv_canary_buffers decode`` on both kinds of file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kv_canary_buffers import CanaryStore, FailBits, Violation, ViolationReport, verify_reference
from kv_canary_buffers.decode import main as decode_main
from kv_canary_buffers.hashing import to_unsigned
from tests.helpers.canary import new_plan, new_store, set_verify_plan, set_verify_rows

ROOT = Path(__file__).resolve().parents[2]
# SGLang 0.5.23, python/sglang/test/kv_canary/violation_log_utils.py, _VIOLATION_LINE_RE
SGLANG_LINE = re.compile(r"kv_canary violation: launch_tag=(\S+) fail_reason=(\S+)")


def _store_with_violations() -> tuple[CanaryStore, ViolationReport]:
    """A store whose verify found rows of several kinds (records of junk against a hand
    plan), the report left in its ring, and the same report as ``take_violations`` reads
    it from a deep copy."""
    import copy

    store = new_store(num_slots=16, violation_capacity=8, device="cpu")
    store.owners[3], store.owners[5] = 4, 11  # slot 7: never written (owner unknown)
    plan = new_plan(device="cpu")
    set_verify_plan(plan, slots=[3, 5, 7], prevs=[-1, 3, 5], positions=[0, 1, 2], tokens=[1, 2, 3])
    set_verify_rows(plan, reqs=[4, 9], counts=[1, 2])  # entry 0: request 4; 1 and 2: 9
    verify_reference(store, plan, launch_tag=7)
    report = copy.deepcopy(store).take_violations()
    assert report.appended >= 3
    return store, report


def test_log_lines_are_sglangs_frozen_format():
    _, report = _store_with_violations()
    lines = report.log_lines(tag_names={7: "HEAD_FULL"})
    assert len(lines) == len(report.violations)
    for line, v in zip(lines, report.violations):
        m = SGLANG_LINE.match(line)
        assert m, line
        assert m.group(1) == "HEAD_FULL"
        labels = {
            FailBits.CHAIN: "verify_chain_hash",
            FailBits.POSITION: "verify_position",
            FailBits.REAL_KV: "verify_real_kv_hash",
            FailBits.VERIFY_TOKEN: "verify_token",
        }
        assert m.group(2).split("+") == [labels[b] for b in labels if b in v.fail_bits]
        assert (
            f" slot_idx={v.slot} position={v.position} stored_token={v.stored_token} "
            f"expected_token={v.expected_token} "
            f"stored_chain_hash={to_unsigned(v.stored_chain_hash):#018x} "
            f"expected_aux={to_unsigned(v.expected_aux):#018x}"
        ) in line
    # this project's fields after SGLang's, each key=value
    assert [line.split("expected_aux=")[1].split(" ", 1)[1] for line in lines] == [
        "req_pool_index=4 expected_position=0 owner=4",
        "req_pool_index=9 expected_position=1 owner=11",
        "req_pool_index=9 expected_position=2 owner=-1",
    ]
    # without names a tag is its number
    assert report.log_lines()[0].startswith("kv_canary violation: launch_tag=7 fail_reason=")


def test_a_write_rows_labels():
    row = Violation.from_row(
        [2, 9, 4, 11, 12, -1, 5, int(FailBits.WRITE_TOKEN | FailBits.WRITE_POSITION)]
    )
    line = row.log_line()
    assert SGLANG_LINE.match(line).group(2) == "write_token+write_position"
    assert "stored_chain_hash=0xffffffffffffffff expected_aux=0x0000000000000005" in line


def test_the_json_form_reads_back_unchanged():
    _, report = _store_with_violations()
    text = json.dumps(report.to_dict())
    again = ViolationReport.from_dict(json.loads(text))
    assert again == report
    first = json.loads(text)["violations"][0]
    assert first["fail_reasons"] == [
        b.name for b in FailBits if b and b in report.violations[0].fail_bits
    ]


@pytest.mark.parametrize("how", ["save", "torch.save"])
def test_a_store_saved_and_loaded_holds_every_byte(tmp_path, how):
    store, report = _store_with_violations()
    store.status.fill_(5)
    path = tmp_path / "store.pt"
    if how == "save":
        store.save(path)
        again = CanaryStore.load(path, device="cpu")
        # the file is plain tensors: loadable without unpickling code
        assert torch.load(path, weights_only=True)["format"] == "kv-canary-store"
    else:
        torch.save(store, path)
        again = torch.load(path, weights_only=False)
    assert type(again) is CanaryStore and again.arena is not store.arena
    assert again.arena.tensor.equal(store.arena.tensor)
    assert again.take_violations() == report
    assert [v.owner for v in report.violations] == [4, 11, -1]


def test_a_store_saved_before_the_context_existed_loads_with_it_zeroed(tmp_path):
    """Version 1 of the file (before owners, violation_context and verify_skipped) loads:
    its fields as saved, the new ones zeroed, its rows decoded without context."""
    store, report = _store_with_violations()
    path = tmp_path / "store.pt"
    store.save(path)
    data = torch.load(path, weights_only=True)
    assert data["version"] == 2
    data["version"] = 1
    for name in ("owners", "violation_context", "verify_skipped"):
        del data["fields"][name]
    torch.save(data, path)
    again = CanaryStore.load(path, device="cpu")
    assert again.records.equal(store.records) and again.violations.equal(store.violations)
    assert (again.owners == 0).all() and (again.violation_context == 0).all()
    assert int(again.verify_skipped) == 0
    old = again.take_violations()
    assert [v.slot for v in old.violations] == [v.slot for v in report.violations]
    assert all(
        (v.req_pool_index, v.expected_position, v.owner) == (0, 0, -1) for v in old.violations
    )
    data["version"] = 3
    torch.save(data, path)
    with pytest.raises(
        ValueError, match=r"^kv-canary: .* must be a saved store of version 1 or 2, got version 3"
    ):
        CanaryStore.load(path, device="cpu")


def test_load_refuses_what_is_not_a_saved_store(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"records": torch.zeros(4, 4)}, path)
    with pytest.raises(
        ValueError, match=r"^kv-canary: path must be a file written by CanaryStore.save"
    ):
        CanaryStore.load(path, device="cpu")
    store = CanaryStore.allocate(num_slots=8, violation_capacity=2, device="cpu")
    store.save(path)
    data = torch.load(path, weights_only=True)
    data["fields"]["records"] = torch.zeros(7, 4, dtype=torch.int64)
    torch.save(data, path)
    with pytest.raises(
        ValueError,
        match=r"field records must be torch.int64 \[8, 4\] for its sizes, got torch.int64 \[7, 4\]",
    ):
        CanaryStore.load(path, device="cpu")
    with pytest.raises(ValueError, match="device must be a device with memory"):
        CanaryStore.load(tmp_path / "other.pt", device="meta")


def test_decode_prints_a_saved_store_and_a_json_report(tmp_path, capsys):
    store, report = _store_with_violations()
    store.save(tmp_path / "store.pt")
    (tmp_path / "report.json").write_text(json.dumps(report.to_dict()))
    assert decode_main([str(tmp_path / "store.pt")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "CanaryStore: num_slots=16 violation_capacity=8 generation=0 status=OK"
    assert out[1].startswith(f"kv-canary: {report.appended} violation(s)")
    assert out[2:] == [f"  {v}" for v in report.violations]
    assert decode_main([str(tmp_path / "report.json"), "--format", "log"]) == 0
    assert capsys.readouterr().out.splitlines() == report.log_lines()
    assert decode_main([str(tmp_path / "report.json"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] == report.to_dict()
    (tmp_path / "junk.txt").write_text("not a report")
    assert decode_main([str(tmp_path / "junk.txt")]) == 2
    assert capsys.readouterr().err.startswith("kv-canary: FILE must be a store saved by")


def test_decode_from_the_command_line(tmp_path):
    store, report = _store_with_violations()
    store.save(tmp_path / "store.pt")
    done = subprocess.run(
        [sys.executable, "-m", "kv_canary_buffers", "decode", str(tmp_path / "store.pt")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith(f"kv-canary: {report.appended} violation(s)")


def test_metrics_count_what_the_reports_say():
    prometheus_client = pytest.importorskip("prometheus_client")
    from kv_canary_buffers.metrics import CanaryMetrics

    registry = prometheus_client.CollectorRegistry()
    metrics = CanaryMetrics(registry=registry, tag_names={7: "HEAD_FULL"})
    store, report = _store_with_violations()

    def value(name, **labels):
        return registry.get_sample_value(f"kv_canary_{name}_total", labels) or 0

    metrics.observe(report, store="head/full")
    chain = sum(FailBits.CHAIN in v.fail_bits for v in report.violations)
    assert chain > 0
    assert (
        value(
            "violations", store="head/full", fail_reason="verify_chain_hash", launch_tag="HEAD_FULL"
        )
        == chain
    )
    assert value("kernel_runs", store="head/full") == report.kernel_runs == 1
    assert value("slots_processed", store="head/full") == report.slots_processed == 3
    # the next report adds the increase of the cumulative counters only
    plan = new_plan(device="cpu")
    set_verify_plan(plan, slots=[3], prevs=[-1], positions=[0])
    verify_reference(store, plan, launch_tag=9)
    metrics.observe(store.take_violations(), store="head/full")
    assert value("kernel_runs", store="head/full") == 2
    assert value("slots_processed", store="head/full") == 4
    assert (
        value("violations", store="head/full", fail_reason="verify_position", launch_tag="9") >= 0
    )
    # a verify that checked nothing (an overflowed or write-only plan) is counted
    assert value("verify_skipped", store="head/full") == 0
    plan.verify_enable.fill_(0)
    for _ in range(2):
        verify_reference(store, plan, launch_tag=9)
    skipped = store.take_violations()
    assert skipped.verify_skipped == 2 and not skipped
    metrics.observe(skipped, store="head/full")
    assert value("verify_skipped", store="head/full") == 2
