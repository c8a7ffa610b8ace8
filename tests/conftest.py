"""Test set-up: without CUDA the Triton kernels run in Triton's interpreter on CPU
tensors. TRITON_INTERPRET must be set before any @triton.jit module is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from kv_canary_buffers import plan_reference
from kv_canary_kernels import launch_plan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

PLAN_PATHS = {"reference": plan_reference, "kernels": launch_plan}


@pytest.fixture(params=sorted(PLAN_PATHS))
def plan(request):
    """Each plan path in turn: the torch reference and the Triton launcher."""
    return PLAN_PATHS[request.param]


@pytest.fixture
def device():
    return DEVICE


LARGE_PATHS = {"large-one-launch": {}, "large-three-launches": {"one_launch_max_rows": 0}}
"""The two kernel paths of a batch of at least SCAN_BLOCK rows: one launch (eager, below
``one_launch_max_rows``) and three (captured graphs and larger batches), as
``launch_config`` changes."""


@pytest.fixture(params=sorted(LARGE_PATHS))
def large_path(request):
    """Each large-batch kernel path in turn, for the test's duration (the small path and
    the reference ignore it)."""
    from kv_canary_kernels.config import launch_config

    with launch_config(**LARGE_PATHS[request.param]):
        yield request.param


@pytest.fixture(params=["reference", "kernels"])
def canary(request):
    """Each write/verify path in turn: the torch references and the Triton launchers."""
    from canary_helpers import CANARY_PATHS

    return CANARY_PATHS[request.param]
