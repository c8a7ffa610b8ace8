"""Every host-side error of the contract, on both plan paths: it raises with a message
that names the argument, and leaves every byte of the buffers as it was."""

import pytest
import torch

from kv_canary_buffers import PlanBuffers
from tests.helpers.plan import assert_untouched, poison, snapshot

I64, I32 = torch.int64, torch.int32


def good_kwargs(device):
    return dict(
        req_pool_indices=torch.tensor([1, 2], dtype=I64, device=device),
        prefix_lens=torch.tensor([3, 2], dtype=I64, device=device),
        extend_seq_lens=torch.tensor([1, 1], dtype=I64, device=device),
        req_to_token=torch.arange(32, dtype=I32, device=device).reshape(4, 8),
        swa_window_size=2,
        full_to_swa_index_mapping=torch.arange(64, dtype=I64, device=device),
        req_to_verify_expected_tokens=torch.arange(32, dtype=I32, device=device).reshape(4, 8),
        req_to_verify_expected_tokens_valid_lens=torch.tensor([8, 8], dtype=I64, device=device),
        kv_token_id_vs_position_offset=0,
    )


CASES = {
    "wrong dtype": (
        lambda k, d: k.update(prefix_lens=k["prefix_lens"].to(I32)),
        ValueError,
        "kv-canary: prefix_lens must have dtype torch.int64, got torch.int32",
    ),
    "table wrong dtype": (
        lambda k, d: k.update(req_to_token=k["req_to_token"].to(I64)),
        ValueError,
        "kv-canary: req_to_token must have dtype torch.int32, got torch.int64",
    ),
    "lut wrong dtype": (
        lambda k, d: k.update(full_to_swa_index_mapping=k["full_to_swa_index_mapping"].to(I32)),
        ValueError,
        "full_to_swa_index_mapping must have dtype torch.int64, got torch.int32",
    ),
    "pool wrong dtype": (
        lambda k, d: k.update(
            req_to_verify_expected_tokens=k["req_to_verify_expected_tokens"].to(I64)
        ),
        ValueError,
        "req_to_verify_expected_tokens must have dtype torch.int32, got torch.int64",
    ),
    "not contiguous": (
        lambda k, d: k.update(req_to_token=torch.zeros(8, 4, dtype=I32, device=d).t()),
        ValueError,
        r"kv-canary: req_to_token must be contiguous, got strides \(1, 4\)",
    ),
    "row not contiguous": (
        lambda k, d: k.update(extend_seq_lens=torch.ones(4, dtype=I64, device=d)[::2]),
        ValueError,
        "kv-canary: extend_seq_lens must be contiguous",
    ),
    "wrong rank table": (
        lambda k, d: k.update(req_to_token=torch.zeros(8, dtype=I32, device=d)),
        ValueError,
        r"kv-canary: req_to_token must be 2-D \[rows, max_seq_len\], got 1-D",
    ),
    "wrong rank rows": (
        lambda k, d: k.update(req_pool_indices=torch.ones(2, 1, dtype=I64, device=d)),
        ValueError,
        r"kv-canary: req_pool_indices must be 1-D \[bs\], got 2-D shape \(2, 1\)",
    ),
    "wrong rank lut": (
        lambda k, d: k.update(full_to_swa_index_mapping=torch.zeros(2, 2, dtype=I64, device=d)),
        ValueError,
        r"full_to_swa_index_mapping must be 1-D \[lut_len\], got 2-D",
    ),
    "wrong rank pool": (
        lambda k, d: k.update(req_to_verify_expected_tokens=torch.zeros(4, dtype=I32, device=d)),
        ValueError,
        r"req_to_verify_expected_tokens must be 2-D \[pool_rows, pool_cols\]",
    ),
    "row tensor of wrong rank": (
        lambda k, d: k.update(prefix_lens=torch.zeros(2, 1, dtype=I64, device=d)),
        ValueError,
        r"kv-canary: prefix_lens must be 1-D \[bs\], got 2-D shape \(2, 1\)",
    ),
    "row tensor on another device": (
        lambda k, d: k.update(extend_seq_lens=k["extend_seq_lens"].to("meta")),
        ValueError,
        "kv-canary: extend_seq_lens must be on the buffers' device .*, got meta",
    ),
    "lengths differ": (
        lambda k, d: k.update(prefix_lens=torch.zeros(3, dtype=I64, device=d)),
        ValueError,
        "kv-canary: prefix_lens must have length bs = len\\(req_pool_indices\\) = 2, got 3",
    ),
    "valid lens length differs": (
        lambda k, d: k.update(
            req_to_verify_expected_tokens_valid_lens=torch.zeros(1, dtype=I64, device=d)
        ),
        ValueError,
        "req_to_verify_expected_tokens_valid_lens must have length bs",
    ),
    "bs over capacity": (
        lambda k, d: k.update(
            req_pool_indices=torch.ones(5, dtype=I64, device=d),
            prefix_lens=torch.ones(5, dtype=I64, device=d),
            extend_seq_lens=torch.ones(5, dtype=I64, device=d),
            req_to_verify_expected_tokens_valid_lens=torch.ones(5, dtype=I64, device=d),
        ),
        ValueError,
        "bs = len\\(req_pool_indices\\) must be <= write_req_capacity, got 5 > 4",
    ),
    "negative window": (
        lambda k, d: k.update(swa_window_size=-1),
        ValueError,
        r"kv-canary: swa_window_size must be in \[0, 9223372036854775807\], got -1",
    ),
    "window not an int": (
        lambda k, d: k.update(swa_window_size=2.0),
        TypeError,
        "kv-canary: swa_window_size must be an int, got float",
    ),
    "window without lut": (
        lambda k, d: k.update(full_to_swa_index_mapping=None),
        ValueError,
        "full_to_swa_index_mapping must be given when swa_window_size > 0, got None",
    ),
    "pool without valid lens": (
        lambda k, d: k.update(req_to_verify_expected_tokens_valid_lens=None),
        ValueError,
        "req_to_verify_expected_tokens_valid_lens must be given with",
    ),
    "valid lens without pool": (
        lambda k, d: k.update(req_to_verify_expected_tokens=None),
        ValueError,
        "req_to_verify_expected_tokens_valid_lens must be None when",
    ),
    "offset not an int": (
        lambda k, d: k.update(kv_token_id_vs_position_offset=None),
        TypeError,
        "kv_token_id_vs_position_offset must be an int, got NoneType",
    ),
    "not a tensor": (
        lambda k, d: k.update(prefix_lens=[3, 2]),
        TypeError,
        "kv-canary: prefix_lens must be a torch.Tensor, got list",
    ),
    "different device": (
        lambda k, d: k.update(req_to_token=k["req_to_token"].to("meta")),
        ValueError,
        "kv-canary: req_to_token must be on the buffers' device .*, got meta",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_host_side_error_raises_before_any_write(plan, device, case):
    mutate, exc, match = CASES[case]
    buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=device)
    poison(buffers)
    before = snapshot(buffers)
    kwargs = good_kwargs(device)
    mutate(kwargs, device)
    with pytest.raises(exc, match=match):
        plan(buffers, **kwargs)
    assert_untouched(buffers, before)
    plan(buffers, **good_kwargs(device))  # the same buffers still work afterwards
    assert int(buffers.verify_num_valid) == 4


@pytest.mark.parametrize("impostor", [None, object(), "buffers", {"write_offsets": 1}])
def test_buffers_that_are_not_plan_buffers_raise_type_error(plan, device, impostor):
    with pytest.raises(
        TypeError, match=r"kv-canary: buffers must be a kv_canary_buffers\.PlanBuffers"
    ):
        plan(impostor, **good_kwargs(device))


def test_a_lookalike_buffers_class_is_rejected(plan, device):
    real = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=device)

    class LookAlike:
        def __getattr__(self, name):
            return getattr(real, name)

    with pytest.raises(TypeError, match="got LookAlike"):
        plan(LookAlike(), **good_kwargs(device))


def test_launch_plan_on_cpu_without_the_interpreter_names_plan_reference():
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from kv_canary_buffers import PlanBuffers\n"
        "from kv_canary_kernels import launch_plan\n"
        "b = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device='cpu')\n"
        "z = torch.zeros(1, dtype=torch.int64)\n"
        "try:\n"
        "    launch_plan(b, req_pool_indices=z, prefix_lens=z, extend_seq_lens=z,\n"
        "                req_to_token=torch.zeros(1, 1, dtype=torch.int32))\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert "kv-canary: launch_plan needs a CUDA device for buffers.device, got cpu" in out.stdout
    assert "kv_canary_buffers.plan_reference" in out.stdout


def test_write_and_verify_on_cpu_without_the_interpreter_name_the_references():
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from kv_canary_buffers import CanaryStore, PlanBuffers\n"
        "from kv_canary_kernels import launch_verify, launch_write\n"
        "s = CanaryStore.allocate(num_slots=8, violation_capacity=2, device='cpu')\n"
        "p = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=1, device='cpu')\n"
        "z = torch.zeros(1, dtype=torch.int64)\n"
        "for call in (lambda: launch_write(s, p, input_ids=z, positions=z.clone(),\n"
        "                                  out_cache_loc=z.clone()),\n"
        "             lambda: launch_verify(s, p)):\n"
        "    try:\n"
        "        call()\n"
        "    except RuntimeError as e:\n"
        "        print(e)\n"
        "print(int(s.kernel_runs), int(s.violation_count))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    for line in lines[:2]:
        assert line.startswith("kv-canary: the Triton kernels need a CUDA device, got ")
        assert "write_reference" in line and "verify_reference" in line
    assert lines[2] == "0 0"  # nothing written


def test_argument_checks_live_in_checks_py():
    """Integer, capacity and input-tensor checks are written once, in
    ``kv_canary_buffers/checks.py``: no other module of the package converts an integer
    argument itself or defines a tensor check."""
    from pathlib import Path

    import kv_canary_buffers

    package = Path(kv_canary_buffers.__file__).parent
    for path in sorted(package.glob("*.py")):
        # devices.py reads an int as a CUDA index, with its own words, and lies below
        # checks.py (whose tensor checks compare devices)
        if path.name in ("checks.py", "devices.py"):
            continue
        source = path.read_text()
        for pattern in ("operator.index(", "isinstance(value, bool)", "def check_tensor"):
            assert pattern not in source, f"{path.name} checks arguments itself: {pattern}"
