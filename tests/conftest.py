"""Test set-up: without CUDA the Triton kernels run in Triton's interpreter on CPU
tensors. TRITON_INTERPRET must be set before any @triton.jit module is imported.

Markers (pyproject.toml): ``gpu`` tests are skipped without CUDA and ``two_gpu`` tests with
fewer than two CUDA devices, here, once; ``slow`` marks the tests that take longest (run
``-m "not slow"`` for a quick pass).

The tests live in folders by stage and concern (docs/testing.md has the map); each folder
runs alone (``pytest tests/plan``), with the shared helpers of ``tests/helpers``.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from kv_canary_buffers import plan_reference
from kv_canary_kernels import launch_plan
from tests.helpers import DEVICE, LARGE_PATHS

PLAN_PATHS = {"reference": plan_reference, "kernels": launch_plan}


@pytest.fixture(params=sorted(PLAN_PATHS))
def plan(request):
    """Each plan path in turn: the torch reference and the Triton launcher."""
    return PLAN_PATHS[request.param]


@pytest.fixture
def device():
    return DEVICE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what this machine cannot run: ``gpu`` tests without CUDA, ``two_gpu`` tests
    with fewer than two CUDA devices."""
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    no_gpu = pytest.mark.skip(reason="needs CUDA")
    one_gpu = pytest.mark.skip(reason="needs two CUDA devices")
    for item in items:
        if devices < 2 and "two_gpu" in item.keywords:
            item.add_marker(no_gpu if devices == 0 else one_gpu)
        elif devices == 0 and "gpu" in item.keywords:
            item.add_marker(no_gpu)


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
    from tests.helpers.canary import CANARY_PATHS

    return CANARY_PATHS[request.param]
