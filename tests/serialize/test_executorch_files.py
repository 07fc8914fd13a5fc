"""Reading `.pte` files that ExecuTorch wrote, and writing them back.

ExecuTorch is the oracle: for each reference model, what exirc reads from the
bytes must be exactly what ExecuTorch put in (its own schema dataclasses),
and what exirc writes back must load and run in ExecuTorch's runtime with
the same results as the original file.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch

import exirc.serialize.program as P
from exirc.errors import FormatError
from exirc.serialize import deserialize
from exirc.serialize.writer import serialize
from tests.oracle import (
    MODEL_NAMES,
    MODELS,
    RUNNABLE_MODEL_NAMES,
    assert_same,
    executorch_pte,
    executorch_read,
    model_inputs,
    reference_outputs,
    requires_executorch,
    run_with_executorch,
)

pytestmark = [requires_executorch, pytest.mark.oracle]


@functools.cache
def _read(name: str) -> P.Program:
    pte, _ = executorch_pte(name)
    return deserialize(pte)


def _et(name: str) -> Any:
    return executorch_pte(name)[1]


def _plan_pairs(name: str) -> list[tuple[P.ExecutionPlan, Any]]:
    ours, theirs = _read(name), _et(name)
    assert len(ours.execution_plan) == len(theirs.execution_plan)
    return list(zip(ours.execution_plan, theirs.execution_plan))


# --------------------------------------------------------------------------
# The registry itself: the oracle must be sound before we trust it.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", RUNNABLE_MODEL_NAMES)
def test_oracle_runs_models_like_eager_pytorch(name: str) -> None:
    pte, _ = executorch_pte(name)
    got = run_with_executorch(pte, model_inputs(name))
    want = reference_outputs(name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_registry_covers_the_value_kinds_and_features() -> None:
    kinds: set[str] = set()
    dtypes: set[int] = set()
    dynamism: set[int] = set()
    for name in MODEL_NAMES:
        for plan in _et(name).execution_plan:
            for value in plan.values:
                kinds.add(type(value.val).__name__)
                if type(value.val).__name__ == "Tensor":
                    dtypes.add(int(value.val.scalar_type))
                    dynamism.add(int(value.val.shape_dynamism))
    assert {"Null", "Int", "Bool", "Double", "Tensor", "IntList", "TensorList",
            "OptionalTensorList"} <= kinds
    assert {int(P.ScalarType.FLOAT), int(P.ScalarType.LONG)} <= dtypes
    assert int(P.TensorShapeDynamism.DYNAMIC_BOUND) in dynamism
    assert any(_et(n).execution_plan[0].delegates for n in MODEL_NAMES)


# --------------------------------------------------------------------------
# What exirc reads equals what ExecuTorch wrote.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_program_header_fields(name: str) -> None:
    ours, theirs = _read(name), _et(name)
    assert ours.version == theirs.version
    assert [p.name for p in ours.execution_plan] == [p.name for p in theirs.execution_plan]
    # Everything the reader produces is exirc's model, not ET's.
    assert isinstance(ours, P.Program)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_operators(name: str) -> None:
    for ours, theirs in _plan_pairs(name):
        assert [(o.name, o.overload) for o in ours.operators] == [
            (o.name, o.overload) for o in theirs.operators
        ]
        assert_same(ours.operators, theirs.operators, f"{ours.name}.operators")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_values(name: str) -> None:
    for ours, theirs in _plan_pairs(name):
        assert len(ours.values) == len(theirs.values)
        assert [type(v).__name__ for v in ours.values] == [
            type(v.val).__name__ for v in theirs.values
        ]
        for i, (mine, et_value) in enumerate(zip(ours.values, theirs.values)):
            assert_same(mine, et_value, f"{ours.name}.values[{i}]")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tensor_values_in_detail(name: str) -> None:
    # Spelled out for the fields memory planning and loading depend on, so a
    # failure names the field directly.
    for ours, theirs in _plan_pairs(name):
        for i, (mine, et_value) in enumerate(zip(ours.values, theirs.values)):
            et = et_value.val
            if type(et).__name__ != "Tensor":
                continue
            where = f"{ours.name}.values[{i}]"
            assert isinstance(mine, P.Tensor), where
            assert mine.scalar_type == P.ScalarType(et.scalar_type.value), where
            assert mine.sizes == list(et.sizes), where
            assert mine.dim_order == list(et.dim_order), where
            assert mine.data_buffer_idx == et.data_buffer_idx, where
            assert mine.shape_dynamism == P.TensorShapeDynamism(et.shape_dynamism.value), where
            if et.allocation_info is None:
                assert mine.allocation_info is None, where
            else:
                assert mine.allocation_info is not None, where
                assert mine.allocation_info.memory_id == et.allocation_info.memory_id, where
                expected_offset = (
                    et.allocation_info.memory_offset_high << 32
                ) | et.allocation_info.memory_offset_low
                assert mine.allocation_info.offset == expected_offset, where


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_chains_and_instructions(name: str) -> None:
    for ours, theirs in _plan_pairs(name):
        assert len(ours.chains) == len(theirs.chains)
        for c, (chain, et_chain) in enumerate(zip(ours.chains, theirs.chains)):
            where = f"{ours.name}.chains[{c}]"
            assert chain.inputs == list(et_chain.inputs), where
            assert chain.outputs == list(et_chain.outputs), where
            assert len(chain.instructions) == len(et_chain.instructions), where
            for i, (instr, et_instr) in enumerate(zip(chain.instructions, et_chain.instructions)):
                et_args = et_instr.instr_args
                assert type(instr).__name__ == type(et_args).__name__, f"{where}.instructions[{i}]"
                assert_same(instr, et_instr, f"{where}.instructions[{i}]")
            assert_same(chain.stacktrace, et_chain.stacktrace, f"{where}.stacktrace")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_kernel_calls_reference_real_operators_and_values(name: str) -> None:
    # Independent of the comparison above: the indices exirc read resolve to
    # the same operator names and value kinds as ExecuTorch's.
    for ours, theirs in _plan_pairs(name):
        for chain, et_chain in zip(ours.chains, theirs.chains):
            for instr, et_instr in zip(chain.instructions, et_chain.instructions):
                et_args = et_instr.instr_args
                if isinstance(instr, P.KernelCall):
                    assert ours.operators[instr.op_index].qualified_name == (
                        theirs.operators[et_args.op_index].name
                        + "."
                        + theirs.operators[et_args.op_index].overload
                    ).rstrip(".")
                    assert [type(ours.values[a]).__name__ for a in instr.args] == [
                        type(theirs.values[a].val).__name__ for a in et_args.args
                    ]
                elif isinstance(instr, P.DelegateCall):
                    assert ours.delegates[instr.delegate_index].id == (
                        theirs.delegates[et_args.delegate_index].id
                    )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_inputs_outputs_memory_and_metadata(name: str) -> None:
    for ours, theirs in _plan_pairs(name):
        assert ours.inputs == list(theirs.inputs)
        assert ours.outputs == list(theirs.outputs)
        assert ours.non_const_buffer_sizes == list(theirs.non_const_buffer_sizes)
        assert_same(
            ours.non_const_buffer_device, theirs.non_const_buffer_device,
            f"{ours.name}.non_const_buffer_device",
        )
        assert_same(
            ours.container_meta_type, theirs.container_meta_type,
            f"{ours.name}.container_meta_type",
        )
        assert len(ours.inputs) == len(model_inputs(name))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_whole_plans(name: str) -> None:
    # Catch-all: every ExecutionPlan field, including ones added later.
    # Delegates are compared by test_delegates (ET renumbers their payloads
    # when it writes the file).
    for ours, theirs in _plan_pairs(name):
        for f in dataclasses.fields(theirs):
            if f.name != "delegates":
                assert_same(getattr(ours, f.name), getattr(theirs, f.name), f"{ours.name}.{f.name}")


def _our_payload(program: P.Program, ref: P.BackendDelegateDataReference) -> bytes:
    if ref.location == P.DataLocation.INLINE:
        return bytes(program.backend_delegate_data[ref.index].data)
    return bytes(program.segments[ref.index].data)


def _et_payload(program: Any, ref: Any) -> bytes:
    # The in-memory program ExecuTorch returns keeps payloads inline.
    assert ref.location.name == "INLINE"
    return bytes(program.backend_delegate_data[ref.index].data)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_delegates(name: str) -> None:
    # ET's in-memory program shares one inline entry between delegates with
    # equal payloads; the file it writes gives each delegate its own entry.
    # So compare what each reference resolves to, not the index.
    ours, theirs = _read(name), _et(name)
    for plan, et_plan in zip(ours.execution_plan, theirs.execution_plan):
        assert len(plan.delegates) == len(et_plan.delegates)
        for i, (d, et_d) in enumerate(zip(plan.delegates, et_plan.delegates)):
            where = f"{plan.name}.delegates[{i}]"
            assert d.id == et_d.id, where
            assert_same(d.compile_specs, et_d.compile_specs, f"{where}.compile_specs")
            assert isinstance(d.processed.location, P.DataLocation), where
            assert _our_payload(ours, d.processed) == _et_payload(theirs, et_d.processed), where


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_constants(name: str) -> None:
    ours, theirs = _read(name), _et(name)
    et_buffers = [bytes(b.storage) for b in theirs.constant_buffer]
    # ET moves constant_buffer into a segment when it writes the file: one
    # offset per buffer, including the reserved empty entry 0.
    assert ours.constant_segment is not None
    assert len(ours.constant_segment.offsets) == len(et_buffers)
    assert ours.constant_count() == len(et_buffers)
    offsets = ours.constant_segment.offsets
    assert offsets == sorted(offsets)
    assert ours.constant_segment.segment_index < len(ours.segments)
    segment = ours.segments[ours.constant_segment.segment_index].data
    for i, expected in enumerate(et_buffers):
        got = bytes(ours.constant_data(i))
        # The slice runs to the next buffer, so it may carry alignment padding.
        assert got[: len(expected)] == expected, f"constant buffer {i} differs"
        assert len(got) - len(expected) < 64, f"constant buffer {i}: too much trailing data"
        assert offsets[i] + len(expected) <= len(segment)
    # Every tensor's constant index is in range and its data fits.
    for plan in ours.execution_plan:
        for value in plan.values:
            if isinstance(value, P.Tensor) and value.data_buffer_idx:
                assert value.data_buffer_idx < len(et_buffers)
                assert len(et_buffers[value.data_buffer_idx]) == value.nbytes


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_named_data(name: str) -> None:
    pte, _ = executorch_pte(name)
    store = executorch_read(pte).named_data
    expected = {} if store is None else {
        key: bytes(store.buffers[entry.buffer_index]) for key, entry in store.pte_data.items()
    }
    ours = _read(name)
    got = {n.key: bytes(ours.segments[n.segment_index].data) for n in ours.named_data}
    assert got == expected


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_reading_from_path_and_memoryview_agrees(name: str, tmp_path: Any) -> None:
    pte, _ = executorch_pte(name)
    path = tmp_path / f"{name}.pte"
    path.write_bytes(pte)
    expected = _read(name)
    assert deserialize(path) == expected
    assert deserialize(str(path)) == expected
    assert deserialize(memoryview(pte)) == expected


@pytest.mark.parametrize("name", ["mlp", "no_constants"])
def test_truncated_executorch_file_is_a_format_error(name: str) -> None:
    pte, _ = executorch_pte(name)
    for cut in (len(pte) // 2, 7):
        with pytest.raises(FormatError):
            deserialize(pte[:cut])


# --------------------------------------------------------------------------
# Writing back.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_rewrite_is_a_fixed_point(name: str) -> None:
    once = _read(name)
    rewritten = serialize(once)
    assert deserialize(rewritten) == once
    # Writing the same program again gives the same bytes.
    assert serialize(deserialize(rewritten)) == rewritten


def _assert_executorch_reads_the_same(original: bytes, rewritten: bytes) -> None:
    theirs = executorch_read(original)
    ours = executorch_read(rewritten)
    assert len(ours.program.execution_plan) == len(theirs.program.execution_plan)
    for plan, et_plan in zip(ours.program.execution_plan, theirs.program.execution_plan):
        assert plan == et_plan
    assert _constant_buffers(ours) == _constant_buffers(theirs)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_rewrite_reads_the_same_in_executorch_reader(name: str) -> None:
    # ExecuTorch's Python reader sees the same program in our bytes as in its own.
    pte, _ = executorch_pte(name)
    _assert_executorch_reads_the_same(pte, serialize(_read(name)))


def _constant_buffers(pte_file: Any) -> list[bytes]:
    buffers = [bytes(b.storage) for b in pte_file.program.constant_buffer]
    # ET's reader gives [] for a file without an extended header (ET writes
    # those when there are no constants) and [b""] when a segment holds just
    # the reserved entry: both mean "no constants".
    return buffers or [b""]


@pytest.mark.parametrize("name", RUNNABLE_MODEL_NAMES)
def test_rewrite_runs_in_executorch_like_the_original(name: str) -> None:
    pte, _ = executorch_pte(name)
    rewritten = serialize(_read(name))
    # Guard: a malformed program can crash the runtime (and the whole test
    # session) instead of failing a test, so only run what ET's reader
    # already sees as the original program.
    _assert_executorch_reads_the_same(pte, rewritten)
    inputs = model_inputs(name)
    want = run_with_executorch(pte, inputs)
    got = run_with_executorch(rewritten, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


def test_rewrite_of_dynamic_model_runs_at_other_sizes() -> None:
    pte, _ = executorch_pte("dynamic_add")
    rewritten = serialize(_read("dynamic_add"))
    _assert_executorch_reads_the_same(pte, rewritten)
    model = MODELS["dynamic_add"].module()
    for batch in (1, 5, 8):
        x = torch.randn(batch, 4)
        got = run_with_executorch(rewritten, [x])
        assert torch.equal(got[0], run_with_executorch(pte, [x])[0])
        with torch.no_grad():
            torch.testing.assert_close(got[0], model(x), rtol=1e-5, atol=1e-5)
