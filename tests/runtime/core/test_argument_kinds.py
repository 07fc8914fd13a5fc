"""Each KernelCall's values against its schema, checked at load before any
memory is allocated or any kernel sees them: kinds, optionals, result slots."""

from __future__ import annotations

import pytest
import torch

from exirc.errors import FormatError
from exirc.runtime import load
from exirc.runtime.core.argument_kinds import category
from exirc.runtime.kernels.allowlist import allowlisted_operators
from exirc.runtime.kernels.exirc_ops import OWN_KERNELS
from exirc.runtime.kernels.quantized import QUANTIZED_KERNELS
from exirc.runtime.kernels.registry import KERNELS, parse_schema
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, planned

AT = "execution_plan[0].chains[0].instructions[0]"


def test_every_argument_of_the_runtime_kernels_is_checked() -> None:
    # A schema type with no category would reach its kernel unchecked.
    # (Other tests register kernels of their own: only the runtime's are listed.)
    shipped = [tuple(key.rsplit(".", 1)) for key in allowlisted_operators()]
    for spec in {**OWN_KERNELS, **QUANTIZED_KERNELS}:
        schema = parse_schema(spec)
        shipped.append((schema.name, schema.overload_name))
    shipped += [tuple(key.rsplit(".", 1)) if "." in key.partition("::")[2] else (key, "")
                for key in KERNELS.operator_names()
                if key.startswith(("executorch_prim::", "dim_order_ops::", "aten::sym_"))]
    assert len(shipped) > 250
    for name, overload in shipped:
        kernel = KERNELS.find(name, overload)
        assert kernel is not None, (name, overload)
        for arg in kernel.schema.arguments:
            assert category(arg)[0] is not None, (kernel.name, arg.name, str(arg.real_type))


def test_a_bad_kind_is_refused_before_memory_is_allocated() -> None:
    values: list[P.EValue] = [planned(0, [2]), P.Int(3), P.Int(1), planned(16, [2])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::add.out"],
                    inputs=[0], outputs=[3], arena=1 << 30)  # over max_memory: never allocated
    with pytest.raises(FormatError) as caught:
        load(serialize(program), max_memory=1 << 20)
    assert str(caught.value) == (f"{AT} (aten::add.out), argument 'other' expects Tensor "
                                 "(a Tensor value), but value 1 is a Int")


def test_null_only_where_the_schema_says_optional() -> None:
    # clamp.out(Tensor self, Scalar? min, Scalar? max, *, Tensor(a!) out)
    values: list[P.EValue] = [planned(0, [3]), P.Null(), P.Double(0.5), planned(16, [3])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::clamp.out"],
                    inputs=[0], outputs=[3])
    x = torch.tensor([-1.0, 0.25, 2.0])
    (out,) = load(serialize(program)).run("forward", [x])
    assert torch.equal(out, x.clamp(max=0.5))
    values[0] = P.Null()
    with pytest.raises(FormatError, match=r"argument 'self' expects Tensor \(a Tensor value\), "
                                          r"but value 0 is a Null"):
        load(serialize(build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::clamp.out"],
                             inputs=[], outputs=[3])))


@pytest.mark.parametrize("kind", [P.OptionalTensorList, P.TensorList])
def test_optional_tensor_lists_take_either_list(kind: type) -> None:
    # index.Tensor_out(Tensor self, Tensor?[] indices, *, Tensor(a!) out)
    values: list[P.EValue] = [planned(0, [4]), kind([2]), planned(32, [2], P.ScalarType.LONG),
                              planned(64, [2])]
    program = build(values, [P.KernelCall(0, [0, 1, 3, 3])], ["aten::index.Tensor_out"],
                    inputs=[0, 2], outputs=[3])
    x = torch.tensor([10.0, 11.0, 12.0, 13.0])
    (out,) = load(serialize(program)).run("forward", [x, torch.tensor([3, 1])])
    assert torch.equal(out, torch.tensor([13.0, 11.0]))


def test_a_scalar_list_is_not_a_tensor_list() -> None:
    values: list[P.EValue] = [planned(0, [4]), P.IntList([2]), P.Int(0), planned(64, [2])]
    program = build(values, [P.KernelCall(0, [0, 1, 3, 3])], ["aten::index.Tensor_out"],
                    inputs=[0], outputs=[3])
    with pytest.raises(FormatError, match=r"argument 'indices' expects List\[Optional\[Tensor\]\] "
                                          r"\(a OptionalTensorList or TensorList value\), but "
                                          r"value 1 is a IntList"):
        load(serialize(program))


def test_a_result_goes_to_a_slot_of_its_kind() -> None:
    # sym_size.int(Tensor self, int dim) -> SymInt: its result slot must be an Int.
    values: list[P.EValue] = [planned(0, [2, 3]), P.Int(1), planned(32, [1])]
    program = build(values, [P.KernelCall(0, [0, 1, 2])], ["aten::sym_size.int"],
                    inputs=[0], outputs=[2])
    with pytest.raises(FormatError) as caught:
        load(serialize(program))
    assert str(caught.value) == (f"{AT} (aten::sym_size.int) puts result 0 (int) into value 2, "
                                 "a Tensor")


def test_a_result_in_a_slot_of_its_kind_runs() -> None:
    values: list[P.EValue] = [planned(0, [2, 3]), P.Int(1), P.Int(0)]
    program = build(values, [P.KernelCall(0, [0, 1, 2])], ["aten::sym_size.int"],
                    inputs=[0], outputs=[2])
    assert load(serialize(program)).run("forward", [torch.ones(2, 3)]) == [3]


def test_result_slots_must_match_the_results_in_number() -> None:
    values: list[P.EValue] = [planned(0, [2, 3]), P.Int(1), P.Int(0), P.Int(0)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3])], ["aten::sym_size.int"],
                    inputs=[0], outputs=[2])
    with pytest.raises(FormatError, match=r"has 2 result slots for the operator's 1 results"):
        load(serialize(program))
