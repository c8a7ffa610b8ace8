"""``benchmarks.revisions``: the probes that compare revisions (``kernels_vs_revisions``,
``launchers_vs_revisions``, ``validation_host --baseline``, ``write_loop_cycles REV``) load
another revision's packages in either layout of the library, before and since the layout
by stage (bf15e2c), and run an older revision's kernels on this tree's owners."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from benchmarks import revisions
from kv_canary_buffers import CanaryStore, PlanBuffers, plan, verify, write
from kv_canary_buffers.write import validate_write_args
from kv_canary_kernels import launch_write
from tests.helpers import DEVICE

ROOT = Path(__file__).resolve().parents[2]
PRE_LAYOUT = "4c86cba"
"""The last commit before the layout by stage: ``kv_canary_buffers.validation`` whole."""


@pytest.fixture
def isolated_imports(monkeypatch):
    """What a test loads (exported packages, the alias, a baseline) leaves with it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("kvk_", "kv_canary_buffers_baseline", revisions.OLD_VALIDATION)):
            del sys.modules[name]


def test_validators_of_this_tree_are_the_stage_modules():
    import kv_canary_buffers

    assert revisions.validators(kv_canary_buffers) == (
        plan.validate_plan_args,
        verify.validate_verify_args,
        write.validate_write_args,
    )


def test_validators_of_a_package_of_the_old_layout(tmp_path, isolated_imports):
    package = tmp_path / "kv_canary_buffers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "validation.py").write_text(
        "def validate_plan_args(): return 'plan'\n"
        "def validate_verify_args(): return 'verify'\n"
        "def validate_write_args(): return 'write'\n"
    )
    old = revisions.load_buffers(tmp_path, "kv_canary_buffers_baseline_old")
    assert [f() for f in revisions.validators(old)] == ["plan", "verify", "write"]


def test_the_old_validation_module_is_this_trees_stage_modules(isolated_imports):
    sys.modules.pop(revisions.OLD_VALIDATION, None)
    revisions.alias_old_layout()
    from kv_canary_buffers.validation import (  # type: ignore[import-not-found]
        PlanArgs,
        VerifyArgs,
        WriteArgs,
        validate_plan_args,
        validate_verify_args,
        validate_write_args,
    )

    assert (PlanArgs, validate_plan_args) == (plan.PlanArgs, plan.validate_plan_args)
    assert (VerifyArgs, validate_verify_args) == (verify.VerifyArgs, verify.validate_verify_args)
    assert (WriteArgs, validate_write_args) == (write.WriteArgs, write.validate_write_args)


def _history_has(rev: str) -> bool:
    done = subprocess.run(
        ["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    return done.returncode == 0


def _write_case():
    """Three rows (2, 1 and 3 tokens), seeded from zeroed records, slots a permutation."""
    lengths = [2, 1, 3]
    rows, n = len(lengths), sum(lengths)
    g = torch.Generator().manual_seed(7)
    perm = torch.randperm(n + rows, generator=g) + 1  # slot 0 is the padding slot
    buffers = PlanBuffers.allocate(write_req_capacity=rows, verify_capacity=1, device=DEVICE)
    buffers.write_num_valid_reqs.fill_(rows)
    buffers.write_offsets.copy_(torch.tensor([0, 2, 3, 6]))
    buffers.write_seed_slot_indices.copy_(perm[:rows])
    step = dict(
        input_ids=torch.randint(0, 50_000, (n,), generator=g).to(DEVICE),
        positions=torch.tensor([1, 2, 1, 1, 2, 3]).to(DEVICE),
        out_cache_loc=perm[rows : rows + n].to(DEVICE),
    )
    return buffers, step, n + rows + 1


@pytest.mark.skipif(not _history_has(PRE_LAYOUT), reason="needs the repository's history")
def test_a_revision_of_the_old_layout_writes_this_trees_records(tmp_path, isolated_imports):
    """``git archive`` of a revision from before the layout by stage, imported beside this
    tree's kernels: its dispatch on this tree's validated arguments, and its launcher (which
    validates through the old module name), write the records this tree's ``launch_write``
    writes (the kernel did not change across the layout)."""
    old = revisions.export_kernels(PRE_LAYOUT, tmp_path)
    old_write = revisions.stage_module(old, "write")
    assert old.__name__ == revisions.package_name(PRE_LAYOUT)
    assert Path(old_write.__file__).is_relative_to(tmp_path)
    buffers, step, num_slots = _write_case()
    stores = [
        CanaryStore.allocate(num_slots=num_slots, violation_capacity=8, device=DEVICE)
        for _ in range(3)
    ]
    launch_write(stores[0], buffers, **step)
    old_write.dispatch_write(stores[1], buffers, validate_write_args(stores[1], buffers, **step))
    old.launch_write(stores[2], buffers, **step)
    assert int(stores[0].slots_processed) == 6
    for store in stores[1:]:
        assert torch.equal(stores[0].records, store.records)
        assert int(store.slots_processed) == 6
        assert int(store.violation_count) == int(store.status) == 0


@pytest.mark.skipif(not _history_has(PRE_LAYOUT), reason="needs the repository's history")
def test_a_copy_is_found_from_the_folder_above_it(tmp_path, isolated_imports):
    """A revision given as the folder that ``git archive REV kv_canary_kernels | tar -x -C
    DIR`` fills (``DIR``, not ``DIR/kv_canary_kernels``) is the same copy as a git
    revision: the path a device call carries works either way."""
    data = subprocess.run(
        ["git", "archive", PRE_LAYOUT, "kv_canary_kernels"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    copy = tmp_path / "copy"
    copy.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(copy, filter="data")
    package = revisions.export_kernels(str(copy), tmp_path / "into")
    assert Path(revisions.stage_module(package, "write").__file__).is_relative_to(tmp_path)
    assert hasattr(revisions.stage_module(package, "verify"), "dispatch_verify")


@pytest.mark.skipif(not _history_has(PRE_LAYOUT), reason="needs the repository's history")
def test_a_revision_before_the_source_table_verifies_this_trees_real_kv(tmp_path, isolated_imports):
    """``kernels_vs_revisions`` hands a revision from before per-source geometry (whose
    ``source_args`` reads ``RealKV.sources`` as tensors) a ``LegacyRealKV``: its verify then
    finds the overwritten slot this tree's ``launch_verify`` finds, and nothing else."""
    from benchmarks.probes.kernels_vs_revisions import args_for
    from kv_canary_buffers import RealKV, RealKVMode, plan_reference
    from kv_canary_buffers.verify import validate_verify_args
    from kv_canary_kernels import launch_verify

    old_verify = revisions.stage_module(revisions.export_kernels(PRE_LAYOUT, tmp_path), "verify")
    lengths = [2, 1, 3]
    table = torch.zeros(4, 4, dtype=torch.int32)
    slots = torch.randperm(16, generator=torch.Generator().manual_seed(3))[:6] + 1
    row_of = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    pos = torch.tensor([0, 1, 0, 0, 1, 2])
    table[row_of + 1, pos] = slots.to(torch.int32)
    table = table.to(DEVICE)
    kv = torch.randint(-(2**40), 2**40, (17, 4), device=DEVICE)
    real_kv = RealKV(mode=RealKVMode.PARTIAL, sources=(kv,), page_size=1, bytes_per_token=32)
    rows = torch.tensor([1, 2, 3], device=DEVICE)
    wplan = PlanBuffers.allocate(write_req_capacity=3, verify_capacity=1, device=DEVICE)
    vplan = PlanBuffers.allocate(write_req_capacity=3, verify_capacity=16, device=DEVICE)
    ones = torch.ones(3, dtype=torch.int64, device=DEVICE)
    lens = torch.tensor(lengths, device=DEVICE)
    plan_reference(wplan, req_pool_indices=rows, prefix_lens=lens * 0, extend_seq_lens=lens,
                   req_to_token=table)  # fmt: skip
    plan_reference(vplan, req_pool_indices=rows, prefix_lens=lens, extend_seq_lens=ones,
                   req_to_token=table)  # fmt: skip
    stores = [CanaryStore.allocate(num_slots=17, violation_capacity=8, device=DEVICE) for _ in "ab"]
    step = dict(input_ids=torch.arange(6, device=DEVICE) + 5, positions=pos.to(DEVICE),
                out_cache_loc=slots.to(DEVICE))  # fmt: skip
    for store in stores:
        launch_write(store, wplan, **step, real_kv=real_kv)
    kv[int(slots[4])] += 1  # row 3's second token overwritten
    launch_verify(stores[0], vplan, real_kv=real_kv)
    validated = validate_verify_args(stores[1], vplan, check_expected_tokens=False, real_kv=real_kv)
    given = args_for(old_verify, validated)
    assert given.real_kv is not real_kv and given.real_kv.sources[0] is kv
    old_verify.dispatch_verify(stores[1], vplan, given)
    for store in stores:
        assert int(store.violation_count) == 1 and int(store.status) == 0
    assert torch.equal(stores[0].violations[:1, :8], stores[1].violations[:1, :8])
    assert [v.slot for v in stores[0].take_violations().violations] == [int(slots[4])]
