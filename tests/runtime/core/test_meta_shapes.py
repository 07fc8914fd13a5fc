"""Outs and results have the sizes and dtypes the op makes, checked at load by meta kernels.

Each KernelCall with fixed shapes is run on meta tensors as the file declares
them: an out or result of another size or dtype, or arguments the op
refuses, is a FormatError at load naming the instruction, the operator and
the argument. Ops whose outputs depend on the data, and dynamic shapes, are
left to run time; a split's pieces are counted before any are made; and a
thousand instructions are checked well within a second.
"""

from __future__ import annotations

import time

import pytest
import torch

from exirc.errors import FormatError
from exirc.runtime import load
from exirc.runtime.core.meta_shapes import meta_op
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_argument_checks import AT, add_over_self, unplanned
from tests.runtime.core.test_interpreter import build, planned

F32 = P.ScalarType.FLOAT
I64 = P.ScalarType.LONG


def test_an_out_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(FormatError) as caught:
        load(serialize(add_over_self(planned(64, [3, 2]))))
    assert str(caught.value) == (
        "execution_plan[0].chains[0].instructions[0] (aten::add.out): argument 'out' (value 4) "
        "is declared float32[3, 2], but the operator makes it [2, 3] from these arguments")


def test_arguments_that_do_not_broadcast_are_refused() -> None:
    values: list[P.EValue] = [planned(0, [2, 3]), planned(32, [3, 2]), P.Int(1),
                              planned(64, [2, 3])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::add.out"],
                    inputs=[0, 1], outputs=[3])
    with pytest.raises(FormatError, match=AT.format(0, r"aten::add\.out") + "the operator "
                       "refuses these arguments: Attempting to broadcast a dimension"):
        load(serialize(program))


def test_an_index_of_floats_is_refused() -> None:
    values: list[P.EValue] = [planned(0, [64, 4]), P.Int(0), planned(1024, [8]),
                              planned(1088, [8, 4])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3])], ["aten::index_select.out"],
                    inputs=[0, 2], outputs=[3], arena=2048)
    with pytest.raises(FormatError, match=AT.format(0, r"aten::index_select\.out")
                       + "the operator refuses these arguments: .*long, int"):
        load(serialize(program))


def test_an_out_of_a_dtype_the_result_cannot_be_cast_to_is_refused() -> None:
    with pytest.raises(FormatError, match="the operator refuses these arguments: .*float32 "
                                          "to out tensor with dtype torch.int64"):
        load(serialize(add_over_self(planned(64, [2, 3], I64))))


def test_a_functional_result_is_checked_against_its_slot() -> None:
    """`et_view` is checked as `aten::view`: its result must be the declared slot."""
    values: list[P.EValue] = [planned(0, [2, 4], I64), P.Int(4), P.Int(2), P.IntList([1, 2]),
                              unplanned([2, 4], I64)]
    program = build(values, [P.KernelCall(0, [0, 3, 4])], ["executorch_prim::et_view.default"],
                    inputs=[0], outputs=[4])
    with pytest.raises(FormatError, match=AT.format(0, r"executorch_prim::et_view\.default")
                       + r"result 0 \(value 4\) is declared int64\[2, 4\], but the operator "
                       r"makes it \[4, 2\]"):
        load(serialize(program))


def test_an_impossible_view_is_refused() -> None:
    values: list[P.EValue] = [planned(0, [2, 4], I64), P.Int(3), P.IntList([1]),
                              unplanned([3], I64)]
    program = build(values, [P.KernelCall(0, [0, 2, 3])], ["executorch_prim::et_view.default"],
                    inputs=[0], outputs=[3])
    with pytest.raises(FormatError, match="the operator refuses these arguments: shape '\\[3\\]' "
                                          "is invalid for input of size 8"):
        load(serialize(program))


def test_batch_norm_statistics_may_be_declared_empty() -> None:
    """In inference torch's CPU kernel (and ExecuTorch's) writes no saved mean
    and invstd, and ExecuTorch plans them empty; the meta kernel says [C]."""
    values: list[P.EValue] = [
        planned(0, [1, 4, 2, 2]), planned(64, [4]), planned(80, [4]), planned(96, [4]),
        planned(112, [4]), P.Double(0.1), P.Double(1e-5),
        planned(128, [1, 4, 2, 2]), planned(192, [0]), planned(192, [0]), P.TensorList([7, 8, 9]),
    ]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])],
                    ["aten::_native_batch_norm_legit_no_training.out"],
                    inputs=[0, 1, 2, 3, 4], outputs=[7])
    x, ones, zeros = torch.randn(1, 4, 2, 2), torch.ones(4), torch.zeros(4)
    (out,) = load(serialize(program)).run("forward", [x, ones, zeros, zeros, ones])
    torch.testing.assert_close(out, x, rtol=1e-4, atol=1e-4)


def test_dynamic_shapes_are_left_to_run_time() -> None:
    """An out whose size is known only when it runs is not compared with the
    meta kernel's (the arenas bound it then)."""
    values: list[P.EValue] = [planned(0, [4], dynamic=True), planned(16, [4], dynamic=True),
                              P.Int(1), planned(32, [4], dynamic=True)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::add.out"],
                    inputs=[0, 1], outputs=[3])
    (out,) = load(serialize(program)).run("forward", [torch.ones(3), torch.ones(3)])
    assert torch.equal(out, torch.full((3,), 2.0))


@pytest.mark.parametrize("name", ["aten::nonzero.out", "aten::masked_select.out",
                                  "aten::_local_scalar_dense.default", "aten::unique_dim.out",
                                  "aten::repeat_interleave.Tensor_out"])
def test_ops_whose_outputs_depend_on_data_are_not_meta_checked(name: str) -> None:
    base, overload = name.removeprefix("aten::").split(".")
    schema = getattr(getattr(torch.ops.aten, base), overload)._schema
    assert meta_op(name, schema) is None
    assert meta_op("aten::add.out", torch.ops.aten.add.out._schema) is not None


def test_a_data_dependent_op_loads_and_runs() -> None:
    values: list[P.EValue] = [planned(0, [4]), planned(16, [4, 1], I64, dynamic=True)]
    program = build(values, [P.KernelCall(0, [0, 1])], ["aten::nonzero.out"], inputs=[0],
                    outputs=[1])
    (out,) = load(serialize(program)).run("forward", [torch.tensor([0.0, 1.0, 0.0, 2.0])])
    assert out.tolist() == [[1], [3]]

# ---------------------------------------------------------------------------
# Cost.
# ---------------------------------------------------------------------------


def chain_of_ops(count: int) -> P.Program:
    """`count` instructions, each of another shape (nothing to cache):
    out_k = x[:k + 1]."""
    values: list[P.EValue] = [planned(0, [count, 4]), P.Int(0), P.Int(1), P.Null()]
    instructions: list[P.Instruction] = []
    offset = count * 16
    for k in range(count):
        values += [P.Int(k + 1), planned(offset, [k + 1, 4])]
        instructions.append(P.KernelCall(0, [0, 1, 3, len(values) - 2, 2, len(values) - 1]))
        offset += (k + 1) * 16
    return build(values, instructions, ["aten::slice_copy.Tensor_out"], inputs=[0],
                 outputs=[len(values) - 1], arena=offset)


def test_checking_a_thousand_instructions_takes_well_under_a_second() -> None:
    data = serialize(chain_of_ops(1000))
    started = time.process_time()  # CPU time: a busy machine does not stretch it
    load(data)
    spent = time.process_time() - started
    assert spent < 2.0, f"loading 1000 distinct instructions took {spent:.2f} s of CPU time"


def test_a_split_into_more_pieces_than_outs_is_refused_before_making_them() -> None:
    """A million-row input split by one: the count is arithmetic, checked before
    any meta kernel would make a million pieces."""
    rows = 1 << 20
    values: list[P.EValue] = [
        P.Tensor(F32, [rows], [0]),  # an input the caller supplies: no arena for it
        P.Int(1), P.Int(0), planned(0, [1]), planned(16, [1]), P.TensorList([3, 4]),
    ]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 5])], ["aten::split_copy.Tensor_out"],
                    inputs=[0], outputs=[3, 4])
    data = serialize(program)
    started = time.process_time()  # CPU time: making a million pieces would show
    with pytest.raises(FormatError, match=AT.format(0, r"aten::split_copy\.Tensor_out")
                       + f"argument 'out' has 2 tensors, but the operator makes {rows} "):
        load(data)
    assert time.process_time() - started < 1.0


def test_a_split_into_as_many_pieces_as_outs_runs() -> None:
    values: list[P.EValue] = [planned(0, [4, 2]), P.Int(3), P.Int(0), planned(32, [3, 2]),
                              planned(64, [1, 2]), P.TensorList([3, 4])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 5])], ["aten::split_copy.Tensor_out"],
                    inputs=[0], outputs=[3, 4])
    x = torch.arange(8.0).reshape(4, 2)
    first, second = load(serialize(program)).run("forward", [x])
    assert torch.equal(first, x[:3]) and torch.equal(second, x[3:])
