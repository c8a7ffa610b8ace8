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


@pytest.fixture(params=["reference", "kernels"])
def canary(request):
    """Each write/verify path in turn: the torch references and the Triton launchers."""
    from canary_helpers import CANARY_PATHS

    return CANARY_PATHS[request.param]
