"""``benchmarks.probes.staging_parts`` refuses to run without CUDA (it times CUDA copies)
instead of printing figures of another device."""

import pytest
import torch

from benchmarks.probes import staging_parts


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's path")
def test_refuses_without_cuda(capsys):
    assert staging_parts.main([]) == 1
    assert "needs CUDA" in capsys.readouterr().err
