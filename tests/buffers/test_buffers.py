"""PlanBuffers: sizes by construction, evolve rejection, the tamper re-check, resize,
generation, growth and the status word."""

import attrs
import pytest
import torch

from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import OFFSETS_BLOCK, PLAN_FIELDS, ROW_HINT_STRIDE

OFFSETS_MSG = "kv-canary: write_offsets_len must equal write_req_capacity + 1, got {} and {}"


def make(w=4, v=16, device="cpu"):
    return PlanBuffers.allocate(write_req_capacity=w, verify_capacity=v, device=device)


def test_allocate_sizes_every_tensor_by_construction():
    b = make(w=5, v=7)
    i64, i32 = torch.int64, torch.int32
    expected = {
        "write_offsets": (i64, (6,)),
        "write_seed_slot_indices": (i64, (5,)),
        "write_num_valid_reqs": (i32, (1,)),
        "row_req_pool_indices": (i64, (5,)),
        "verify_slot_indices": (i64, (7,)),
        "verify_expected_tokens": (i64, (7,)),
        "verify_expected_positions": (i64, (7,)),
        "verify_prev_slot_indices": (i64, (7,)),
        "verify_num_valid": (i32, (1,)),
        "verify_enable": (i32, (1,)),
        "verify_offsets": (i64, (6,)),
        "scan_block_sums": (i64, (2, 1)),
        "verify_row_hints": (i32, (1,)),
        "launch_sync": (i64, (4,)),
        "scan_chunk_sums": (i64, (3, 2)),
        "status": (i32, (1,)),
        "dummy_int64": (i64, (1,)),
        "dummy_int32": (i32, (1,)),
    }
    assert set(expected) == {f.name for f in PLAN_FIELDS}
    for name, (dtype, shape) in expected.items():
        t = getattr(b, name)
        assert t.dtype == dtype and tuple(t.shape) == shape and t.is_contiguous(), name
    assert (b.write_req_capacity, b.verify_capacity, b.generation) == (5, 7, 0)
    assert b.device == torch.device("cpu")


def test_scan_scratch_covers_every_block():
    b = make(w=3 * OFFSETS_BLOCK + 1)
    assert b.scan_block_sums.shape == (2, 4)
    # the one-launch path's chunks cover rows 0 .. bs, index bs included
    assert b.scan_chunk_sums.shape == (3, 5)
    assert make(w=3 * OFFSETS_BLOCK).scan_chunk_sums.shape == (3, 4)


def test_row_hints_cover_every_stride_of_verify_entries():
    assert make(v=ROW_HINT_STRIDE).verify_row_hints.shape == (1,)
    assert make(v=2 * ROW_HINT_STRIDE + 1).verify_row_hints.shape == (3,)


@pytest.mark.parametrize("w, v", [(1, 1), (4, 16), (5000, 123457)])
def test_allocation_bytes_equals_nbytes(w, v):
    assert PlanBuffers.allocation_bytes(w, v) == make(w, v).nbytes
    nb = -(-w // OFFSETS_BLOCK)
    nh = -(-v // ROW_HINT_STRIDE)
    # every field of the arena starts on a 256-byte boundary
    field_bytes = (
        [8 * (w + 1), 8 * w, 4, 8 * w]
        + [8 * v] * 4
        + [4, 4, 8 * (w + 1), 16 * nb, 4 * nh, 32, 24 * (nb + 1), 4, 8, 4]
    )
    aligned = sum(-(-n // 256) * 256 for n in field_bytes)
    assert PlanBuffers.allocation_bytes(w, v) == aligned


@pytest.mark.parametrize("name", ["write_req_capacity", "verify_capacity"])
@pytest.mark.parametrize("bad", [0, -1, 2**31])
def test_capacity_out_of_range_raises_value_error(name, bad):
    kwargs = {"write_req_capacity": 4, "verify_capacity": 4, name: bad}
    with pytest.raises(ValueError, match=f"kv-canary: {name} must be in"):
        PlanBuffers.allocate(device="cpu", **kwargs)
    with pytest.raises(ValueError, match=name):
        PlanBuffers.allocation_bytes(kwargs["write_req_capacity"], kwargs["verify_capacity"])


def test_capacity_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match="write_req_capacity must be an int, got float"):
        PlanBuffers.allocate(write_req_capacity=4.0, verify_capacity=4, device="cpu")
    with pytest.raises(TypeError, match="verify_capacity must be an int, got bool"):
        PlanBuffers.allocate(write_req_capacity=4, verify_capacity=True, device="cpu")


def test_fields_cannot_be_rebound():
    b = make()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        b.write_offsets = torch.zeros(5, dtype=torch.int64)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        b.write_req_capacity = 8


def test_evolve_with_capacity_sized_offsets_raises_the_exact_message():
    b = make(w=4)
    with pytest.raises(ValueError) as err:
        attrs.evolve(b, write_offsets=torch.zeros(4, dtype=torch.int64))
    assert str(err.value) == OFFSETS_MSG.format(4, 4)


def test_capacities_are_read_from_the_arena_not_passed_or_rebound():
    b = make(w=4, v=16)
    with pytest.raises(TypeError, match="write_req_capacity"):  # not a constructor argument
        attrs.evolve(b, write_req_capacity=8)
    for name in ("write_req_capacity", "verify_capacity", "device"):
        with pytest.raises(AttributeError):
            object.__setattr__(b, name, 8)
    assert (b.write_req_capacity, b.verify_capacity, b.device) == (4, 16, torch.device("cpu"))


def test_evolve_without_changes_is_refused_as_a_second_owner():
    b = make()
    with pytest.raises(
        ValueError, match="kv-canary: this arena already belongs to a live PlanBuffers"
    ):
        attrs.evolve(b)
    with pytest.raises(ValueError, match="already belongs"):
        attrs.evolve(b, generation=5)
    b.check()


@pytest.mark.parametrize(
    "field, tensor, match",
    [
        (
            "verify_slot_indices",
            torch.zeros(15, dtype=torch.int64),
            r"PlanBuffers.verify_slot_indices must have shape \(16,\) .* got \(15,\)",
        ),
        (
            "verify_num_valid",
            torch.zeros(1, dtype=torch.int64),
            "PlanBuffers.verify_num_valid must have dtype torch.int32, got torch.int64",
        ),
        (
            "write_seed_slot_indices",
            torch.zeros(8, dtype=torch.int64)[::2],
            "PlanBuffers.write_seed_slot_indices must be contiguous",
        ),
        (
            "status",
            torch.zeros(1, dtype=torch.int32, device="meta"),
            "PlanBuffers.status must be on device cpu .* got meta",
        ),
    ],
)
def test_evolve_rejects_wrong_shape_dtype_layout_device(field, tensor, match):
    with pytest.raises(ValueError, match=match):
        attrs.evolve(make(), **{field: tensor})


def test_evolve_rejects_a_non_tensor_and_shared_storage():
    b = make()
    with pytest.raises(TypeError, match=r"PlanBuffers\.status must be a torch\.Tensor, got list"):
        attrs.evolve(b, status=[0])
    with pytest.raises(
        ValueError, match=r"PlanBuffers\.verify_offsets is not the memory it was built with"
    ):
        attrs.evolve(b, verify_offsets=b.write_offsets)


def test_a_field_cannot_be_assigned_or_deleted():
    b = make(w=4)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        b.write_offsets = torch.zeros(5, dtype=torch.int64)  # type: ignore[misc]
    for tamper in (
        lambda: object.__setattr__(b, "write_offsets", torch.zeros(4, dtype=torch.int64)),
        lambda: object.__delattr__(b, "status"),
    ):
        with pytest.raises(AttributeError, match=r"^kv-canary: PlanBuffers\.(write_off|stat)"):
            tamper()
    b.check(views=True)
    assert b.write_offsets.shape == (5,)


def test_each_read_of_a_field_is_a_new_alias_of_the_same_memory():
    b = make(w=4)
    first, second = b.write_offsets, b.write_offsets
    assert first is not second and first.data_ptr() == second.data_ptr()
    first.fill_(7)  # data written through an alias is written to the field
    assert b.write_offsets.tolist() == [7] * 5


def test_in_place_changes_to_a_read_field_leave_the_buffers_intact():
    """What issue 10 refused at every launch cannot reach the buffers any more: an alias
    resized, re-strided or re-pointed changes that alias only."""
    b = make(w=4)
    alias = b.write_offsets
    alias.resize_(4)
    other = b.verify_slot_indices
    other.as_strided_((8,), (2,))
    third = b.verify_num_valid
    third.data = torch.zeros(3, dtype=torch.float32)
    b.check(views=True)
    assert b.write_offsets.shape == (5,) and b.verify_slot_indices.stride() == (1,)
    assert b.verify_num_valid.dtype == torch.int32


def test_a_private_view_tampered_with_is_caught_by_check_views_and_both_plan_paths():
    """The private views are the library's own; a caller that reaches past the public
    fields to them is still refused wherever they are used as tensors, with SGLang's
    message for the offsets."""
    from kv_canary_kernels import launch_plan

    b = make(w=4)
    object.__setattr__(b, "_write_offsets", torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError) as err:
        b.check(views=True)
    assert str(err.value) == OFFSETS_MSG.format(4, 4)
    kwargs = dict(
        req_pool_indices=torch.zeros(1, dtype=torch.int64),
        prefix_lens=torch.zeros(1, dtype=torch.int64),
        extend_seq_lens=torch.zeros(1, dtype=torch.int64),
        req_to_token=torch.zeros(2, 2, dtype=torch.int32),
    )
    # (the kernels under the interpreter hand the views to Triton at every launch)
    for plan in (plan_reference, launch_plan):
        with pytest.raises(ValueError) as err:
            plan(b, **kwargs)
        assert str(err.value) == OFFSETS_MSG.format(4, 4)
    c = make(w=4)
    c._write_offsets.resize_(4)
    with pytest.raises(ValueError, match="write_offsets_len must equal write_req_capacity"):
        c.check(views=True)


def test_resize_returns_new_generation_and_leaves_old_untouched():
    b = make(w=4, v=16)
    b.write_offsets.fill_(3)
    bigger = b.resize(write_req_capacity=10)
    assert bigger is not b
    assert (bigger.write_req_capacity, bigger.verify_capacity, bigger.generation) == (10, 16, 1)
    assert bigger.write_offsets.shape == (11,)
    assert b.generation == 0 and b.write_offsets.tolist() == [3] * 5
    b.check()
    both = bigger.resize(verify_capacity=3)
    assert (both.write_req_capacity, both.verify_capacity, both.generation) == (10, 3, 2)
    with pytest.raises(ValueError, match="verify_capacity must be in"):
        b.resize(verify_capacity=0)


def test_ensure_capacity_returns_same_object_when_it_fits():
    b = make(w=4, v=16)
    assert b.ensure_capacity(write_reqs=4, verify_entries=16) is b
    assert b.ensure_capacity() is b


def test_ensure_capacity_grows_with_headroom():
    b = make(w=4, v=16)
    g = b.ensure_capacity(write_reqs=5)
    assert (g.write_req_capacity, g.verify_capacity, g.generation) == (8, 16, 1)
    g2 = g.ensure_capacity(write_reqs=3, verify_entries=100)
    assert (g2.write_req_capacity, g2.verify_capacity, g2.generation) == (8, 100, 2)
    assert g2.ensure_capacity(verify_entries=101).verify_capacity == 200
    with pytest.raises(ValueError, match="verify_entries must be >= 0"):
        b.ensure_capacity(verify_entries=-1)


def test_take_status_returns_flags_and_clears_them():
    b = make()
    assert b.take_status() == PlanStatus.OK
    b.status.fill_(int(PlanStatus.LUT_SLOT_OUT_OF_RANGE | PlanStatus.VALID_LEN_OUT_OF_RANGE))
    flags = b.take_status()
    assert flags == PlanStatus.LUT_SLOT_OUT_OF_RANGE | PlanStatus.VALID_LEN_OUT_OF_RANGE
    assert int(b.status) == 0 and b.take_status() == PlanStatus.OK


def test_status_bits_are_distinct_single_bits():
    bits = [int(f) for f in PlanStatus if f != PlanStatus.OK]
    assert len(bits) == 8 and len(set(bits)) == 8
    assert all(b & (b - 1) == 0 for b in bits)


def test_repr_is_short():
    assert repr(make()) == (
        "PlanBuffers(write_req_capacity=4, verify_capacity=16, device=device(type='cpu'), "
        "generation=0)"
    )


def test_the_buffers_package_never_imports_triton():
    import subprocess
    import sys

    code = (
        "import sys, kv_canary_buffers, kv_canary_demo.cli\n"
        "from kv_canary_demo.cli import run\n"
        "run(['--steps', '3', '--planner', 'reference'])\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_check_fields_checks_just_those_fields_and_the_arena():
    b = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=8, device="cpu")
    object.__setattr__(b, "_verify_slot_indices", b.verify_slot_indices.clone())
    b.check_fields(("write_offsets", "write_seed_slot_indices"))  # untouched fields: fine
    b.check()  # the arena alone: intact
    with pytest.raises(ValueError, match=r"PlanBuffers\.verify_slot_indices is not the memory"):
        b.check_fields(("verify_slot_indices",))
    with pytest.raises(ValueError, match=r"PlanBuffers\.verify_slot_indices is not the memory"):
        b.check(views=True)
