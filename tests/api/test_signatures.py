"""One source per signature: each stage's keywords are its inputs ``TypedDict``
(``PlanInputs``, ``WriteInputs``, ``VerifyInputs``); the torch reference, the Triton
launcher and the ``torch.compile`` operator take ``**inputs`` of it, and the validation,
which holds the defaults, takes exactly those keywords in that order."""

import inspect
import typing

import pytest

from kv_canary_buffers import (
    PlanInputs,
    VerifyInputs,
    WriteChainInputs,
    WriteInputs,
    WriteStampInputs,
    plan_reference,
    validate_plan_args,
    verify_reference,
    write_chain_reference,
    write_reference,
    write_stamp_reference,
)
from kv_canary_buffers.verify import validate_verify_args
from kv_canary_buffers.write import (
    validate_write_args,
    validate_write_chain_args,
    validate_write_stamp_args,
)
from kv_canary_kernels import (
    compiled,
    launch_plan,
    launch_verify,
    launch_write,
    launch_write_chain,
    launch_write_stamp,
)

STAGES = {
    "plan": (PlanInputs, validate_plan_args, plan_reference, launch_plan, compiled.plan),
    "write": (WriteInputs, validate_write_args, write_reference, launch_write, compiled.write),
    "verify": (
        VerifyInputs,
        validate_verify_args,
        verify_reference,
        launch_verify,
        compiled.verify,
    ),
    "write_chain": (
        WriteChainInputs,
        validate_write_chain_args,
        write_chain_reference,
        launch_write_chain,
        compiled.write_chain,
    ),
    "write_stamp": (
        WriteStampInputs,
        validate_write_stamp_args,
        write_stamp_reference,
        launch_write_stamp,
        compiled.write_stamp,
    ),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_the_validation_takes_exactly_the_typeddicts_keywords(stage):
    inputs, validate, *_ = STAGES[stage]
    params = inspect.signature(validate).parameters
    keywords = [p for p in params.values() if p.kind is p.KEYWORD_ONLY]
    assert [p.name for p in keywords] == list(typing.get_type_hints(inputs))
    for p in keywords:
        # a Required key has no default, every other key has one
        assert (p.default is p.empty) == (p.name in inputs.__required_keys__), p.name


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_entry_point_takes_the_typeddict(stage):
    inputs, _, *entries = STAGES[stage]
    for fn in entries:
        params = list(inspect.signature(fn).parameters.values())
        assert params[-1].kind is params[-1].VAR_KEYWORD, fn.__qualname__
        assert (
            typing.get_type_hints(fn)[params[-1].name] == typing.Unpack[inputs]
            or str(params[-1].annotation) == f"Unpack[{inputs.__name__}]"
        ), fn.__qualname__


def test_the_operator_schemas_follow_the_typeddicts():
    """The schemas are derived from the TypedDicts; these are the interface engines see
    (``torch.ops.kv_canary.*``), written out once here as the expected values."""
    assert compiled.PLAN_SCHEMA == (
        "(Tensor(a!) arena, SymInt handle, Tensor req_pool_indices, Tensor prefix_lens, "
        "Tensor extend_seq_lens, Tensor? req_to_token, Tensor? block_table, SymInt page_size, "
        "SymInt swa_window_size, "
        "Tensor? full_to_swa_index_mapping, Tensor? req_to_verify_expected_tokens, "
        "Tensor? req_to_verify_expected_tokens_valid_lens, "
        "SymInt kv_token_id_vs_position_offset, bool verify) -> ()"
    )
    assert compiled.WRITE_SCHEMA == (
        "(Tensor(a!) store_arena, Tensor plan_arena, SymInt store_handle, SymInt plan_handle, "
        "Tensor input_ids, Tensor positions, Tensor out_cache_loc, SymInt launch_tag, "
        "Tensor? expected_input_ids, Tensor? expected_positions, SymInt real_kv_handle, "
        "Tensor[] sources) -> ()"
    )
    assert compiled.VERIFY_SCHEMA == (
        "(Tensor(a!) store_arena, Tensor plan_arena, SymInt store_handle, SymInt plan_handle, "
        "SymInt launch_tag, bool check_expected_tokens, SymInt real_kv_handle, "
        "Tensor[] sources) -> ()"
    )
    triple = (
        "(Tensor(a!) store_arena, Tensor plan_arena, Tensor(b!) workspace_arena, "
        "SymInt store_handle, SymInt plan_handle, SymInt workspace_handle, "
    )
    assert compiled.WRITE_CHAIN_SCHEMA == triple + (
        "Tensor input_ids, Tensor positions, Tensor out_cache_loc, SymInt launch_tag, "
        "Tensor? expected_input_ids, Tensor? expected_positions) -> ()"
    )
    assert compiled.WRITE_STAMP_SCHEMA == triple + "SymInt real_kv_handle, Tensor[] sources) -> ()"


def test_an_unknown_keyword_is_refused_by_every_entry_point():
    from kv_canary_buffers import PlanBuffers

    buffers = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=4, device="cpu")
    for fn in (plan_reference, launch_plan):
        with pytest.raises(TypeError, match="req_pool_indice"):
            fn(buffers, req_pool_indice=None)  # a misspelt keyword
    assert compiled.plan(buffers, req_pool_indice=None) is False


def test_the_pair_write_takes_the_writes_typeddict_and_the_tails_tag():
    # launch_write_pair, write_pair_reference and their validation: (head, tail,
    # plan_buffers, *, tail_launch_tag=0, **inputs: Unpack[WriteInputs])
    from kv_canary_buffers import write_pair_reference
    from kv_canary_buffers.write import validate_write_pair_args
    from kv_canary_kernels import launch_write_pair

    for fn in (launch_write_pair, write_pair_reference, validate_write_pair_args):
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:3]] == ["head", "tail", "plan_buffers"], fn.__qualname__
        assert params[3].name == "tail_launch_tag" and params[3].default == 0
        assert params[3].kind is params[3].KEYWORD_ONLY
        assert params[4].kind is params[4].VAR_KEYWORD and len(params) == 5
        assert (
            typing.get_type_hints(fn)[params[4].name] == typing.Unpack[WriteInputs]
            or str(params[4].annotation) == "Unpack[WriteInputs]"
        ), fn.__qualname__
