"""``benchmarks.probes.gemm_neighbours`` on the CPU: its ``--smoke`` runs a write case's
chain under the interpreter (the neighbour the H200 run times beside the GEMM), and the
probe refuses to measure without CUDA."""

import torch

from benchmarks.probes import gemm_neighbours


def test_the_smoke_runs_a_chain_and_no_cuda_refuses(capsys):
    assert gemm_neighbours.main(["--smoke"]) == 0
    assert "chain ran" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert gemm_neighbours.main([]) == 1
        assert "needs CUDA" in capsys.readouterr().err
