"""Tensors a KernelCall writes share no memory with the others it names, checked at load.

Hand-built programs whose flaw is known (an out over the index it reads, an
out over a view of it, two outs over each other) must be refused by `load`
with a FormatError that names the instruction, the operator and both
arguments, before anything runs; right programs, the exact aliasing an
elementwise op can take included, must load and run as before. Shapes,
dtypes and dim orders: test_meta_shapes.py and test_dim_order_args.py.
"""

from __future__ import annotations

import pytest
import torch

from exirc.errors import FormatError
from exirc.runtime import load
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, constant, planned

F32 = P.ScalarType.FLOAT
I64 = P.ScalarType.LONG
AT = r"execution_plan\[0\]\.chains\[0\]\.instructions\[{}\] \({}\): "
"""The start of a load-time error about instruction {} running operator {}."""


def unplanned(sizes: list[int], scalar_type: P.ScalarType = F32) -> P.Tensor:
    """A tensor whose memory an instruction (a view, a move) gives it at run time."""
    return P.Tensor(scalar_type, sizes, list(range(len(sizes))))


def index_select(out_offset: int) -> P.Program:
    """forward(table: f32[64, 4] at 0, index: i64[8] at 1024) = table[index],
    its out f32[8, 4] (128 bytes) at `out_offset`."""
    values: list[P.EValue] = [planned(0, [64, 4]), P.Int(0), planned(1024, [8], I64),
                              planned(out_offset, [8, 4])]
    return build(values, [P.KernelCall(0, [0, 1, 2, 3])], ["aten::index_select.out"],
                 inputs=[0, 2], outputs=[3], arena=2048)


# ---------------------------------------------------------------------------
# Overlap.
# ---------------------------------------------------------------------------


def test_an_out_over_the_index_it_reads_is_refused_at_load() -> None:
    with pytest.raises(FormatError) as caught:
        load(serialize(index_select(out_offset=1024)))
    assert str(caught.value) == (
        "execution_plan[0].chains[0].instructions[0] (aten::index_select.out): argument 'out' "
        "(value 3, bytes 1024..1152 of buffer 1) overlaps argument 'index' (value 2, bytes "
        "1024..1088 of buffer 1), which it reads")


def test_an_out_sharing_four_bytes_with_an_input_is_refused() -> None:
    with pytest.raises(FormatError, match=AT.format(0, r"aten::index_select\.out")
                       + r"argument 'out' .* overlaps argument 'self' .*bytes 0\.\.1024 "):
        load(serialize(index_select(out_offset=1020)))


def test_an_out_next_to_its_inputs_loads_and_runs() -> None:
    loaded = load(serialize(index_select(out_offset=1088)))
    table, index = torch.randn(64, 4), torch.tensor([5, 0, 63, 7, 7, 1, 2, 3])
    (out,) = loaded.run("forward", [table, index])
    assert torch.equal(out, table[index])


def view_program(out_offset: int) -> P.Program:
    """index = et_view(raw, [8]) (a view with no memory of its own), then
    index_select(table, 0, index) into an out at `out_offset`."""
    values: list[P.EValue] = [
        planned(0, [64, 4]),         # %0 table
        P.Int(0),                    # %1 dim
        planned(1024, [2, 4], I64),  # %2 raw indices
        P.Int(8), P.IntList([3]),    # %3, %4 the view's size
        unplanned([8], I64),         # %5 index: a view of %2
        planned(out_offset, [8, 4]),  # %6 out
    ]
    instructions: list[P.Instruction] = [P.KernelCall(0, [2, 4, 5]),
                                         P.KernelCall(1, [0, 1, 5, 6])]
    return build(values, instructions, ["executorch_prim::et_view.default",
                                        "aten::index_select.out"],
                 inputs=[0, 2], outputs=[6], arena=2048)


def test_an_out_over_a_view_of_what_it_reads_is_refused() -> None:
    with pytest.raises(FormatError) as caught:
        load(serialize(view_program(out_offset=1024 + 32)))
    assert str(caught.value) == (
        "execution_plan[0].chains[0].instructions[1] (aten::index_select.out): argument 'out' "
        "(value 6, bytes 1056..1184 of buffer 1) overlaps argument 'index' (value 5, a view of "
        "bytes 1024..1088 of buffer 1), which it reads")


def test_a_view_next_to_the_out_loads_and_runs() -> None:
    loaded = load(serialize(view_program(out_offset=1088)))
    table, raw = torch.randn(64, 4), torch.tensor([[1, 2, 3, 4], [60, 61, 62, 0]])
    (out,) = loaded.run("forward", [table, raw])
    assert torch.equal(out, table[raw.reshape(8)])


def test_a_view_followed_through_a_move_in_a_loop_is_still_its_base() -> None:
    """Moves into a tensor with no memory share their source: the dataflow
    follows them, whatever order the instructions come in."""
    values: list[P.EValue] = [
        planned(0, [64, 4]), P.Int(0), planned(1024, [8], I64),
        unplanned([8], I64),     # %3 shares %2 through the move (after its use)
        planned(1024, [8, 4]),   # %4 out over %2's bytes
        P.Bool(True),
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(0, [0, 1, 3, 4]),  # reads %3, which the move below makes %2
        P.MoveCall(2, 3),
        P.JumpFalseCall(5, 0),
    ]
    program = build(values, instructions, ["aten::index_select.out"], inputs=[0, 2],
                    outputs=[4], arena=2048)
    with pytest.raises(FormatError, match=r"overlaps argument 'index' \(value 3, a view of "
                                          r"bytes 1024\.\.1088 of buffer 1\)"):
        load(serialize(program))


def test_two_outs_over_each_other_are_refused() -> None:
    values: list[P.EValue] = [
        planned(0, [4, 4]), P.Int(2), P.IntList([1, 1]), P.Int(0),
        planned(64, [2, 4]), planned(80, [2, 4]), P.TensorList([4, 5]),
    ]
    program = build(values, [P.KernelCall(0, [0, 2, 3, 6])],
                    ["aten::split_with_sizes_copy.out"], inputs=[0], outputs=[4, 5])
    with pytest.raises(FormatError, match=r"item 0 of argument 'out' \(value 4, bytes 64\.\.96 "
                                          r"of buffer 1\) overlaps item 1 of argument 'out' "
                                          r"\(value 5, bytes 80\.\.112 of buffer 1\), which it "
                                          r"writes too"):
        load(serialize(program))


def test_writing_through_a_view_of_a_constant_is_refused() -> None:
    values: list[P.EValue] = [
        planned(0, [6]), constant(1, [2, 3]), P.Int(6), P.IntList([2]),
        unplanned([6]),  # %4: a view of the constant
        P.Int(1),
    ]
    instructions: list[P.Instruction] = [P.KernelCall(0, [1, 3, 4]),
                                         P.KernelCall(1, [0, 0, 5, 4, 4])]
    program = build(values, instructions, ["executorch_prim::et_view.default", "aten::add.out"],
                    inputs=[0], outputs=[4], constants=[[1.0] * 6])
    with pytest.raises(FormatError, match=r"argument 'out' \(value 4\) may be a view of "
                                          r"constant value 1, which it would write into"):
        load(serialize(program))


# ---------------------------------------------------------------------------
# Exact aliasing: only elementwise ops, only the very same tensor.
# ---------------------------------------------------------------------------


def add_over_self(out: P.Tensor) -> P.Program:
    """forward(x: f32[2, 3] at 0, y at 32) = x + y, written into `out` (value 4)."""
    values: list[P.EValue] = [planned(0, [2, 3]), planned(32, [2, 3]), P.Int(1), P.Null(), out]
    return build(values, [P.KernelCall(0, [0, 1, 2, 4, 4])], ["aten::add.out"],
                 inputs=[0, 1], outputs=[4])


def test_an_elementwise_op_may_write_over_an_input_of_the_same_layout() -> None:
    loaded = load(serialize(add_over_self(planned(0, [2, 3]))))
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (out,) = loaded.run("forward", [x, y])
    assert torch.equal(out, x + y)


def test_an_elementwise_op_may_not_write_over_an_input_of_another_layout() -> None:
    transposed = P.Tensor(F32, [2, 3], [1, 0], allocation_info=P.AllocationDetails.at(1, 0))
    with pytest.raises(FormatError, match=r"argument 'out' .*bytes 0\.\.24 of buffer 1\) "
                                          r"overlaps argument 'self'"):
        load(serialize(add_over_self(transposed)))


def test_an_elementwise_op_may_not_write_over_part_of_an_input() -> None:
    with pytest.raises(FormatError, match=r"argument 'out' \(value 4, bytes 4\.\.28 of buffer 1\) "
                                          r"overlaps argument 'self'"):
        load(serialize(add_over_self(planned(4, [2, 3]))))


def test_a_matrix_product_may_not_write_over_its_input() -> None:
    values: list[P.EValue] = [planned(0, [3, 3]), planned(64, [3, 3])]
    program = build(values, [P.KernelCall(0, [0, 1, 0])], ["aten::mm.out"], inputs=[0, 1],
                    outputs=[0])
    with pytest.raises(FormatError, match=AT.format(0, r"aten::mm\.out") + r"argument 'out' "
                       r"\(value 0, bytes 0\.\.36 of buffer 1\) overlaps argument 'self'"):
        load(serialize(program))

