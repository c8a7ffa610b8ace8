"""Hostile callers: tampering with a PlanBuffers or a GraphInputs after construction,
inputs that alias the buffers, look-alike buffers, copies, and staging passed with other
buffers. Each case must raise a ``kv-canary:`` error (never a raw one, never a crash)
and leave every byte of the arena as it was."""

import copy
import pickle
import re
import unittest.mock

import attrs
import pytest
import torch

from kv_canary_buffers import GraphInputs, PlanBuffers
from tests.helpers import DEVICE
from tests.helpers.plan import (
    arena_bytes,
    arena_snapshot,
    assert_arena_unchanged,
    poison_arena,
)

I64, I32 = torch.int64, torch.int32
OFFSETS_MSG = "kv-canary: write_offsets_len must equal write_req_capacity + 1, got {} and {}"


def make(w=4, v=16):
    b = PlanBuffers.allocate(write_req_capacity=w, verify_capacity=v, device=DEVICE)
    poison_arena(b)
    return b


def kwargs(n=3):
    return dict(
        req_pool_indices=torch.arange(1, n + 1, dtype=I64, device=DEVICE) % 4,
        prefix_lens=torch.full((n,), 3, dtype=I64, device=DEVICE),
        extend_seq_lens=torch.ones(n, dtype=I64, device=DEVICE),
        req_to_token=torch.arange(32, dtype=I32, device=DEVICE).reshape(4, 8),
        full_to_swa_index_mapping=torch.arange(100, 140, dtype=I64, device=DEVICE),
        req_to_verify_expected_tokens=torch.arange(32, dtype=I32, device=DEVICE).reshape(4, 8),
        req_to_verify_expected_tokens_valid_lens=torch.full((n,), 8, dtype=I64, device=DEVICE),
    )


def refused(fn, exc, match):
    """``fn()`` raises ``exc`` whose message starts with kv-canary: and matches."""
    with pytest.raises(exc) as err:
        fn()
    assert str(err.value).startswith("kv-canary:"), str(err.value)
    assert re.search(match, str(err.value)), str(err.value)


# --- tampering with the buffers after construction ---------------------------------
# The public fields are FieldAlias reads: each read is a new alias of a private view, and
# assigning or deleting one is refused. So a tensor a caller holds can be changed in place
# without reaching the buffers; what is shared is the arena's storage and the object's
# own attributes (its arena; its private views, for a caller that reaches past the public
# fields), and those are re-checked.
def private(name):
    return lambda b: getattr(b, "_" + name)


def in_place_tamperings(field):
    """Each in-place change of a field's tensor, ``field(b)`` giving the tensor."""
    return {
        "set_ to another field": lambda b: field("verify_offsets")(b).set_(
            field("write_offsets")(b)
        ),
        ".data = another field": lambda b: setattr(
            field("verify_offsets")(b), "data", field("write_offsets")(b)
        ),
        ".data = a view of another dtype": lambda b: setattr(
            field("verify_num_valid")(b), "data", b.verify_num_valid.view(torch.float32)
        ),
        "as_strided_ in place": lambda b: field("verify_slot_indices")(b).as_strided_((8,), (2,)),
        # same shape, reaching into the next field
        "as_strided_ to the same shape with stride 2": lambda b: field("verify_slot_indices")(
            b
        ).as_strided_((16,), (2,)),
        "t_ in place": lambda b: field("scan_block_sums")(b).t_(),
        "resize_ smaller in place": lambda b: field("write_offsets")(b).resize_(4),
    }


PUBLIC_IN_PLACE = in_place_tamperings(lambda name: lambda b: getattr(b, name))
"""In place on a read field: changes that alias only."""

PRIVATE_IN_PLACE = in_place_tamperings(private)
PRIVATE_MESSAGES = {
    "set_ to another field": (ValueError, "PlanBuffers.verify_offsets is not the memory"),
    ".data = another field": (ValueError, "PlanBuffers.verify_offsets is not the memory"),
    ".data = a view of another dtype": (
        ValueError,
        "PlanBuffers.verify_num_valid must have dtype torch.int32",
    ),
    "as_strided_ in place": (ValueError, "PlanBuffers.verify_slot_indices must have shape"),
    "as_strided_ to the same shape with stride 2": (
        ValueError,
        "PlanBuffers.verify_slot_indices must be contiguous",
    ),
    "t_ in place": (ValueError, "PlanBuffers.scan_block_sums must have shape"),
    "resize_ smaller in place": (ValueError, OFFSETS_MSG.format(4, 4).replace("+", r"\+")),
}


def grown_in_place(b):
    b.verify_prev_slot_indices.resize_(1 << 20)  # reallocates the arena's storage


def storage_freed(b):
    b.write_seed_slot_indices.untyped_storage().resize_(0)


def arena_rebound_to_junk(b):
    object.__setattr__(b, "arena", "junk")


def arena_rebound_to_another(b):
    other = make()
    TAMPER_KEEPALIVE.append(other)
    object.__setattr__(b, "arena", other.arena)


def everything_rebound_to_another(b):
    other = make()
    TAMPER_KEEPALIVE.append(other)
    for f in attrs.fields(PlanBuffers):
        object.__setattr__(b, f.name, getattr(other, f.name))


TAMPER_KEEPALIVE: list = []


def arena_attribute_rebound(name, value):
    """The arena's own attribute rebound behind its frozen guard (issue 26 §7): with a
    larger ``fields`` the kernels stored entries past their fields into the neighbouring
    ones, the reference raised raw errors after writing part of a plan, and junk types
    raw TypeErrors."""

    def tamper(b):
        object.__setattr__(b.arena, name, value(b) if callable(value) else value)

    return (tamper, ValueError, rf"PlanBuffers\.arena\.{name} must be the object the arena")


def larger_layout(b):
    from kv_canary_buffers.arena import layout
    from kv_canary_buffers.layout import plan_specs

    return layout(plan_specs(64, 4096))[0]  # same names, larger capacities


ARENA_ATTRIBUTES = {
    "Arena.fields rebound to a larger layout": ("fields", larger_layout),
    "Arena.fields rebound to an equal copy": ("fields", lambda b: (*b.arena.fields,)),
    "Arena.fields rebound to junk": ("fields", "junk"),
    "Arena.fields rebound to an int": ("fields", 5),
    "Arena.address rebound": ("address", lambda b: dict.fromkeys(b.arena.address, 16)),
    "Arena.launches rebound to junk": ("launches", None),
    "Arena.device rebound": ("device", torch.device("meta")),
    "Arena.on_device rebound": ("on_device", lambda b: lambda t: True),
    "Arena.handle rebound": ("handle", lambda b: b.arena.handle + 1),
}

TAMPERING = {
    **{
        case: arena_attribute_rebound(name, value)
        for case, (name, value) in ARENA_ATTRIBUTES.items()
    },
    # name: (tamper, exception, message): refused by check() at every launch
    "resize_ larger in place (moves the storage)": (
        grown_in_place,
        ValueError,
        "arena's storage was resized or replaced",
    ),
    "storage resized to 0 bytes": (
        storage_freed,
        ValueError,
        "arena's storage was resized or replaced",
    ),
    "arena rebound to junk": (
        arena_rebound_to_junk,
        TypeError,
        "PlanBuffers.arena must be a kv_canary_buffers.arena.Arena",
    ),
    "arena rebound to another buffers' arena": (
        arena_rebound_to_another,
        ValueError,
        "does not own its arena",
    ),
    "every field rebound to another buffers": (
        everything_rebound_to_another,
        ValueError,
        "does not own its arena",
    ),
    **{
        f"private view: {name}": (PRIVATE_IN_PLACE[name], *PRIVATE_MESSAGES[name])
        for name in PRIVATE_IN_PLACE
    },
    "private view: two fields share memory (object.__setattr__)": (
        lambda b: object.__setattr__(b, "_verify_offsets", b._write_offsets),
        ValueError,
        "PlanBuffers.verify_offsets is not the memory it was built with",
    ),
    "private view: a fresh tensor of the right shape": (
        lambda b: object.__setattr__(
            b, "_verify_slot_indices", torch.zeros(16, dtype=I64, device=DEVICE)
        ),
        ValueError,
        "PlanBuffers.verify_slot_indices is not the memory",
    ),
    "private view: deleted": (
        lambda b: object.__delattr__(b, "_status"),
        AttributeError,
        "PlanBuffers is missing a field",
    ),
    "private view: not a tensor": (
        lambda b: object.__setattr__(b, "_verify_enable", [1]),
        TypeError,
        "PlanBuffers.verify_enable must be a torch.Tensor, got list",
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampered_buffers_raise_a_kv_canary_error_and_stay_unwritten(plan, case):
    tamper, exc, match = TAMPERING[case]
    b = make()
    arena = b.arena  # the memory the buffers were built with, whatever is rebound
    before = arena.byte_view().clone()
    tamper(b)
    moved = arena.storage.data_ptr() != arena.base or arena.storage.nbytes() != arena.nbytes
    kept = None if moved else arena.byte_view().clone()
    refused(lambda: b.check(views=True), exc, match)
    if not case.startswith("private view"):  # the arena itself: the cheap check refuses
        refused(b.check, exc, match)
    # (a launch under the interpreter hands the private views to Triton: re-checked)
    refused(lambda: plan(b, **kwargs()), exc, match)
    for method in (
        b.take_status,
        lambda: b.resize(write_req_capacity=8),
        lambda: copy.deepcopy(b),
        lambda: pickle.dumps(b),
        lambda: GraphInputs.for_buffers(b),
    ):
        refused(method, exc, match)
    if not moved:  # (a freed or moved storage has no old bytes left to compare)
        assert torch.equal(kept, before)
        assert torch.equal(arena.byte_view(), before), "a refused call wrote the arena"
    TAMPER_KEEPALIVE.clear()


REFUSED_AT_ONCE = {
    "two fields share memory (object.__setattr__)": (
        lambda b: object.__setattr__(b, "verify_offsets", b.write_offsets),
        "PlanBuffers.verify_offsets cannot be assigned",
    ),
    "a fresh tensor of the right shape": (
        lambda b: object.__setattr__(
            b, "verify_slot_indices", torch.zeros(16, dtype=I64, device=DEVICE)
        ),
        "PlanBuffers.verify_slot_indices cannot be assigned",
    ),
    "a field that is not a tensor": (
        lambda b: object.__setattr__(b, "verify_enable", [1]),
        "PlanBuffers.verify_enable cannot be assigned",
    ),
    "field deleted": (
        lambda b: object.__delattr__(b, "status"),
        "PlanBuffers.status cannot be deleted",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_AT_ONCE))
def test_rebinding_or_deleting_a_field_is_refused_at_once(plan, case):
    tamper, match = REFUSED_AT_ONCE[case]
    b = make()
    before = arena_snapshot(b)
    refused(lambda: tamper(b), AttributeError, match)
    assert_arena_unchanged(b, before)
    b.check(views=True)
    plan(b, **kwargs())
    assert int(b.verify_num_valid) == 9


@pytest.mark.parametrize("case", sorted(PUBLIC_IN_PLACE))
def test_a_read_field_changed_in_place_leaves_the_buffers_intact(plan, case):
    """What issue 10 refused at every launch cannot reach the buffers: the change stays
    in the alias the caller holds, and a plan on the buffers equals one on fresh buffers."""
    b, fresh = make(), make()
    PUBLIC_IN_PLACE[case](b)
    b.check(views=True)
    plan(b, **kwargs())
    plan(fresh, **kwargs())
    assert torch.equal(arena_bytes(b), arena_bytes(fresh))
    assert int(b.verify_num_valid) == 9


def test_capacities_device_and_generation_cannot_be_rebound_to_break_a_launch(plan):
    b = make()
    for name in ("write_req_capacity", "verify_capacity", "device", "nbytes"):
        with pytest.raises(AttributeError):  # read from the arena: no slot to rebind
            object.__setattr__(b, name, "junk")
    object.__setattr__(b, "generation", "junk")
    refused(
        lambda: b.resize(verify_capacity=32), TypeError, "PlanBuffers.generation must be an int"
    )
    plan(b, **kwargs())  # the plan does not read the generation
    assert int(b.verify_num_valid) == 9


# --- look-alikes ----------------------------------------------------------------------
class SubBuffers(PlanBuffers):
    def check(self) -> None:  # a subclass that would skip the re-check
        pass


class ClaimsToBe:
    @property
    def __class__(self):  # what unittest.mock spec objects report
        return PlanBuffers


@pytest.mark.parametrize(
    "impostor",
    [
        lambda: SubBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEVICE),
        lambda: unittest.mock.Mock(spec=PlanBuffers),
        lambda: unittest.mock.NonCallableMagicMock(spec_set=make()),
        ClaimsToBe,
    ],
    ids=[
        "subclass",
        "Mock(spec=PlanBuffers)",
        "NonCallableMagicMock(spec_set=buffers)",
        "__class__ property",
    ],
)
def test_only_the_exact_type_is_accepted(plan, impostor):
    obj = impostor()
    assert isinstance(obj, PlanBuffers)  # isinstance is fooled; the plan is not
    refused(
        lambda: plan(obj, **kwargs()),
        TypeError,
        "buffers must be a kv_canary_buffers.PlanBuffers .*got " + type(obj).__name__,
    )
    refused(lambda: GraphInputs.for_buffers(obj), TypeError, "got " + type(obj).__name__)


# --- inputs that alias the buffers ----------------------------------------------------
ALIASES = {
    "req_pool_indices": lambda b: b.write_seed_slot_indices[:3],
    "prefix_lens": lambda b: b.verify_slot_indices[:3],
    "extend_seq_lens": lambda b: b.write_offsets[1:4],
    "req_to_token": lambda b: b.verify_expected_tokens.view(I32)[:32].view(4, 8),
    "full_to_swa_index_mapping": lambda b: b.verify_prev_slot_indices[:40],
    "req_to_verify_expected_tokens": lambda b: b.verify_expected_positions.view(I32)[:32].view(
        4, 8
    ),
    "req_to_verify_expected_tokens_valid_lens": lambda b: b.verify_offsets[:3],
}


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_an_input_inside_the_arena_is_refused_before_writing(plan, name):
    """req_pool_indices = buffers.write_seed_slot_indices[:3] planned wrong: one program
    wrote seeds while others still read them."""
    b = make(v=48)
    args = kwargs()
    alias = ALIASES[name](b)
    alias.copy_(args[name].view(alias.shape))  # the same values: only the memory differs
    args[name] = alias
    before = arena_snapshot(b)
    refused(
        lambda: plan(b, **args),
        ValueError,
        f"{name} must not share memory with the PlanBuffers it plans into",
    )
    assert_arena_unchanged(b, before)
    # the same values from another buffers' arena are fine
    other = make(v=48)
    elsewhere = ALIASES[name](other)
    elsewhere.copy_(alias)
    plan(b, **dict(args, **{name: elsewhere}))
    assert int(b.verify_num_valid) == 9


def test_an_empty_view_of_the_arena_holds_no_memory_and_is_accepted(plan):
    b = make()
    z = b.write_seed_slot_indices[2:2]
    plan(
        b,
        req_pool_indices=z,
        prefix_lens=z,
        extend_seq_lens=z,
        req_to_token=torch.zeros(1, 1, dtype=I32, device=DEVICE),
    )
    assert int(b.write_num_valid_reqs) == 0 and b.write_offsets.tolist() == [0] * 5


# --- copies ---------------------------------------------------------------------------
def test_shallow_copy_and_evolve_are_refused_as_second_owners():
    b = make()
    refused(lambda: copy.copy(b), TypeError, "cannot be shallow-copied")
    refused(lambda: attrs.evolve(b), ValueError, "this arena already belongs to a live PlanBuffers")
    refused(
        lambda: PlanBuffers(
            arena=b.arena,
            **{f.alias: getattr(b, f.name) for f in attrs.fields(PlanBuffers) if f.name != "arena"},
        ),
        ValueError,
        "already belongs",
    )
    b.check()  # the refusals left the owner intact


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deep_copy_and_pickle_make_a_new_arena_with_every_byte(plan, how):
    b = make(w=5, v=40).resize(verify_capacity=37)  # generation 1
    poison_arena(b)
    plan(b, **kwargs())
    b.status.fill_(4)
    c = copy.deepcopy(b) if how == "deepcopy" else pickle.loads(pickle.dumps(b))
    assert type(c) is PlanBuffers and c is not b
    assert (c.write_req_capacity, c.verify_capacity, c.generation, c.device) == (5, 37, 1, b.device)
    assert c.arena is not b.arena and c.arena.base != b.arena.base
    assert torch.equal(arena_bytes(c), arena_bytes(b))
    c.check()
    b.check()
    c.verify_slot_indices.fill_(-5)  # independent memory
    assert not bool((b.verify_slot_indices == -5).any())
    assert c.take_status() == 4 and b.take_status() == 4


# --- GraphInputs ----------------------------------------------------------------------
def rows(n, device=DEVICE):
    return dict(
        req_pool_indices=torch.arange(1, n + 1, dtype=I64, device=device) % 4,
        prefix_lens=torch.full((n,), 3, dtype=I64, device=device),
        extend_seq_lens=torch.ones(n, dtype=I64, device=device),
    )


def test_staging_is_validated_at_construction():
    s = GraphInputs.allocate(capacity=4, device=DEVICE)
    refused(
        lambda: attrs.evolve(s, extend_seq_lens=torch.zeros(2, dtype=I64, device=DEVICE)),
        ValueError,
        "GraphInputs.extend_seq_lens must be its own int64 \\[4\\] view",
    )
    refused(lambda: attrs.evolve(s), ValueError, "already belongs to a live GraphInputs")
    refused(
        lambda: attrs.evolve(s, link=5), TypeError, "GraphInputs.link must be None or a StagingLink"
    )
    refused(
        lambda: GraphInputs.allocate(capacity=0, device=DEVICE),
        ValueError,
        r"capacity must be in \[1, 2147483647\]",
    )
    refused(lambda: copy.copy(s), TypeError, "cannot be shallow-copied")


STAGING_TAMPERING = {
    "a 2-element field": (
        lambda s: object.__setattr__(
            s, "extend_seq_lens", torch.zeros(2, dtype=I64, device=DEVICE)
        ),
        ValueError,
        "GraphInputs.extend_seq_lens must be its own",
    ),
    "two fields share memory": (
        lambda s: s.prefix_lens.set_(s.req_pool_indices),
        ValueError,
        "GraphInputs.prefix_lens",
    ),
    "storage freed": (
        lambda s: s.valid_lens.untyped_storage().resize_(0),
        ValueError,
        "storage was resized",
    ),
    "field deleted": (
        lambda s: object.__delattr__(s, "valid_lens"),
        AttributeError,
        "GraphInputs is missing",
    ),
    "link rebound to junk": (
        lambda s: object.__setattr__(s, "link", 3),
        TypeError,
        "GraphInputs.link must be None",
    ),
    "Arena.fields rebound to a larger layout": (
        lambda s: object.__setattr__(
            s.arena, "fields", GraphInputs.allocate(capacity=64, device=DEVICE).arena.fields
        ),
        ValueError,
        r"GraphInputs\.arena\.fields must be the object the arena was built with",
    ),
    "Arena.fields rebound to junk": (
        lambda s: object.__setattr__(s.arena, "fields", "junk"),
        ValueError,
        r"GraphInputs\.arena\.fields must be the object",
    ),
}


@pytest.mark.parametrize("case", sorted(STAGING_TAMPERING))
def test_fill_checks_everything_before_writing_a_byte(case):
    """fill() used to write two inputs before it raised a raw size error."""
    tamper, exc, match = STAGING_TAMPERING[case]
    s = GraphInputs.allocate(capacity=4, device=DEVICE)
    arena_bytes(s).fill_(7)
    before = arena_snapshot(s)
    tamper(s)
    freed = s.arena.storage.nbytes() == 0
    refused(lambda: s.fill(**rows(3)), exc, match)
    refused(s.check, exc, match)
    if not freed:
        assert_arena_unchanged(s, before)


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (dict(valid_lens=torch.zeros(2, dtype=I64)), ValueError, r"valid_lens must have length"),
        (dict(extend_seq_lens=[1, 2, 3]), TypeError, "extend_seq_lens must be a torch.Tensor"),
        (
            dict(prefix_lens="staging-alias"),
            ValueError,
            "prefix_lens must not share memory with the GraphInputs",
        ),
    ],
)
def test_fill_refuses_bad_arguments_before_writing(bad, exc, match):
    s = GraphInputs.allocate(capacity=4, device=DEVICE)
    arena_bytes(s).fill_(7)
    before = arena_snapshot(s)
    args = dict(rows(3), **bad)
    if args.get("prefix_lens") == "staging-alias":
        args["prefix_lens"] = s.valid_lens[:3]
    if "valid_lens" in bad:
        args["valid_lens"] = bad["valid_lens"].to(DEVICE)
    refused(lambda: s.fill(**args), exc, match)
    assert_arena_unchanged(s, before)


def test_staging_built_for_other_buffers_is_refused(plan):
    """Staging built for one PlanBuffers was accepted by another (a resize makes
    another): now the plan refuses it and says to build new staging."""
    b = make()
    staging = GraphInputs.for_buffers(b)
    assert staging.built_for is b and staging.generation == 0
    staging.fill(**rows(3))
    tables = {k: v for k, v in kwargs().items() if k not in rows(1)}
    tables.pop("req_to_verify_expected_tokens_valid_lens")
    tables.pop("req_to_verify_expected_tokens")
    plan(b, **tables, **staging.plan_kwargs())  # its own buffers accept it
    assert int(b.write_num_valid_reqs) == 4
    bigger = b.resize(verify_capacity=64)  # same row capacity, new buffers
    poison_arena(bigger)
    before = arena_snapshot(bigger)
    refused(
        lambda: plan(bigger, **tables, **staging.plan_kwargs()),
        ValueError,
        r"req_pool_indices is staging built for other PlanBuffers \(generation 0\), passed "
        r"with PlanBuffers of generation 1; after a resize build new staging",
    )
    assert_arena_unchanged(bigger, before)
    mixed = dict(staging.plan_kwargs(), req_pool_indices=staging.req_pool_indices.clone())
    refused(lambda: plan(bigger, **tables, **mixed), ValueError, "prefix_lens is staging built")
    # unlinked staging (GraphInputs.allocate) is accepted by any buffers
    shared = GraphInputs.allocate(capacity=4, device=DEVICE)
    shared.fill(**rows(2))
    plan(bigger, **tables, **shared.plan_kwargs())
    plan(b, **tables, **shared.plan_kwargs())
    assert shared.built_for is None and shared.generation is None
    del b
    import gc

    gc.collect()
    refused(
        lambda: plan(bigger, **tables, **staging.plan_kwargs()),
        ValueError,
        "staging built for PlanBuffers that no longer exist",
    )


def test_a_tampered_staging_link_on_a_tensor_is_a_kv_canary_error(plan):
    b = make()
    staging = GraphInputs.for_buffers(b)
    staging.prefix_lens._kv_canary_staging_link = "junk"
    tables = dict(req_to_token=torch.zeros(4, 8, dtype=I32, device=DEVICE))
    refused(
        lambda: plan(b, **tables, **staging.plan_kwargs()),
        TypeError,
        "prefix_lens carries a staging link of type str",
    )


def test_staging_copies_keep_or_follow_their_link(plan):
    b = make()
    staging = GraphInputs.for_buffers(b)
    staging.fill(**rows(3))
    tables = dict(req_to_token=torch.arange(32, dtype=I32, device=DEVICE).reshape(4, 8))
    # deepcopy of the staging alone: new memory, same rows, still linked to b
    alone = copy.deepcopy(staging)
    assert alone.arena.base != staging.arena.base and alone.built_for is b
    assert torch.equal(arena_bytes(alone), arena_bytes(staging))
    plan(b, **tables, **alone.plan_kwargs())
    # deepcopy of the pair: the staging copy follows the buffers copy
    b2, s2 = copy.deepcopy((b, staging))
    assert s2.built_for is b2
    plan(b2, **tables, **s2.plan_kwargs())
    refused(
        lambda: plan(b, **tables, **s2.plan_kwargs()),
        ValueError,
        r"staging built for another PlanBuffers object \(also of generation 0",
    )
    # pickle of the pair: the same
    b3, s3 = pickle.loads(pickle.dumps((b, staging)))
    assert s3.built_for is b3 and s3.generation == 0
    plan(b3, **tables, **s3.plan_kwargs())
    # a pickled or copied *tensor* is an ordinary tensor
    t = pickle.loads(pickle.dumps(staging.req_pool_indices))
    assert t._kv_canary_staging_link is None
    plan(b3, **tables, req_pool_indices=t, prefix_lens=t.clone(), extend_seq_lens=t.clone())
