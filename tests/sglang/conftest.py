"""The ``refs`` fixture: SGLang 0.5.23's kv-canary torch references, downloaded once per
session (``fetch_sglang.fetch``) and imported alone (``sglang_refs.load_references``).

Skipped with the reason when the download fails (no network); failed instead when
``KV_CANARY_REQUIRE_SGLANG=1`` (``.ci/run`` sets it: in CI these tests must run). Skipped
on a GPU machine too, where the kernels do not run on CPU tensors."""

from __future__ import annotations

import os

import pytest

from tests.sglang.fetch_sglang import FetchError, fetch
from tests.sglang.sglang_refs import SglangRefs, load_references


@pytest.fixture(scope="session", name="refs")
def refs_fixture() -> SglangRefs:
    if os.environ.get("TRITON_INTERPRET") != "1":
        # tests/conftest.py sets it without CUDA. These tests keep every tensor on the CPU
        # (SGLang's references run there); on a GPU machine the comparison with SGLang's
        # CUDA kernels is benchmarks/sglang/run_cuda_differential.py.
        pytest.skip("tests/sglang runs this project's kernels in Triton's interpreter (CPU)")
    try:
        root = fetch()
    except FetchError as err:
        if os.environ.get("KV_CANARY_REQUIRE_SGLANG") == "1":
            pytest.fail(f"KV_CANARY_REQUIRE_SGLANG=1 and SGLang's references are missing: {err}")
        pytest.skip(f"SGLang 0.5.23's references could not be downloaded (no network?): {err}")
    return load_references(root)
