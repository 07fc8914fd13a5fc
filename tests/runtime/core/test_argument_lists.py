"""Fixed-length list arguments (`int[4]`, `bool[3]`) are enforced at load, and
lists written at run time when they are read.

ATen kernels index a `T[N]` list without checking its length: a
`reflection_pad2d_backward` given an empty `int[4]` crashed the process.
"""

from __future__ import annotations

import pytest
import torch

from exirc.errors import FormatError
from exirc.runtime import load
from exirc.runtime.core.list_lengths import declared_type, fits, fixed_length
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels.allowlist import allowlisted_operators
from exirc.runtime.kernels.registry import KERNELS
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, planned

PAD_AT = "execution_plan[0].chains[0].instructions[0] (aten::reflection_pad2d.out)"


def schema_argument(key: str, name: str) -> object:
    kernel = KERNELS.find(*key.rsplit(".", 1), any_aten=True)
    assert kernel is not None
    return next(arg for arg in kernel.schema.arguments if arg.name == name)


def pad_program(padding: list[int]) -> P.Program:
    """forward(x: f32[1, 2, 3]) = reflection_pad2d(x, padding), out f32[1, 4, 5]."""
    items = list(range(3, 3 + len(padding)))  # the Int values after the out
    values: list[P.EValue] = [planned(0, [1, 2, 3]), P.IntList(items), planned(32, [1, 4, 5]),
                              *(P.Int(p) for p in padding)]
    return build(values, [P.KernelCall(0, [0, 1, 2, 2])], ["aten::reflection_pad2d.out"],
                 inputs=[0], outputs=[2])


def test_the_right_length_runs() -> None:
    x = torch.arange(6.0).reshape(1, 2, 3)
    (out,) = load(serialize(pad_program([1, 1, 1, 1]))).run("forward", [x])
    assert torch.equal(out, torch.nn.functional.pad(x, [1, 1, 1, 1], mode="reflect"))


@pytest.mark.parametrize("padding", [[], [1], [1, 1, 1], [1, 1, 1, 1, 1]])
def test_a_wrong_length_is_refused_at_load(padding: list[int]) -> None:
    with pytest.raises(FormatError) as caught:
        load(serialize(pad_program(padding)))
    assert str(caught.value) == (
        f"{PAD_AT}, argument 'padding' expects 4 items (int[4]), but value 1, an IntList, "
        f"has {len(padding)}")
    assert caught.value.exit_code == 3


def test_a_list_moved_in_at_run_time_is_checked_when_read() -> None:
    # %1 has 4 items at load; a move puts %3's two there before the pad reads it.
    values: list[P.EValue] = [planned(0, [1, 2, 3]), P.IntList([4, 4, 4, 4]),
                              planned(32, [1, 4, 5]), P.IntList([4, 4]), P.Int(1)]
    instructions: list[P.Instruction] = [P.MoveCall(3, 1), P.KernelCall(0, [0, 1, 2, 2])]
    program = load(serialize(build(values, instructions, ["aten::reflection_pad2d.out"],
                                   inputs=[0], outputs=[2])))
    with pytest.raises(ExecutionError) as caught:
        program.run("forward", [torch.ones(1, 2, 3)])
    message = str(caught.value)
    assert "instruction 1 (aten::reflection_pad2d.out)" in message
    assert "argument 'padding' expects 4 items (int[4]), but value 1 holds 2 when it is read" \
        in message


def test_a_scalar_moved_into_a_list_is_refused_at_load() -> None:
    # The MoveCall's kinds differ, so the file is refused before a kernel could read
    # an int where its list belongs.
    values: list[P.EValue] = [planned(0, [1, 2, 3]), P.IntList([3, 3, 3, 3]),
                              planned(32, [1, 4, 5]), P.Int(1)]
    instructions: list[P.Instruction] = [P.MoveCall(3, 1), P.KernelCall(0, [0, 1, 2, 2])]
    data = serialize(build(values, instructions, ["aten::reflection_pad2d.out"],
                           inputs=[0], outputs=[2]))
    with pytest.raises(FormatError, match=r"moves value 3 \(Int\) into value 1 \(IntList\)"):
        load(data)


def test_an_empty_list_where_the_default_is_empty_means_the_default() -> None:
    # avg_pool2d's `int[2] stride=[]`: an empty stride is the kernel size.
    values: list[P.EValue] = [planned(0, [1, 1, 4, 4]), P.IntList([8, 8]), P.IntList([]),
                              P.IntList([9, 9]), P.Bool(False), P.Bool(True), P.Null(),
                              planned(64, [1, 1, 2, 2]), P.Int(2), P.Int(0)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 4, 5, 6, 7, 7])],
                    ["aten::avg_pool2d.out"], inputs=[0], outputs=[7])
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    (out,) = load(serialize(program)).run("forward", [x])
    assert torch.equal(out, torch.nn.functional.avg_pool2d(x, 2))


def test_an_empty_list_where_the_default_is_not_empty_is_refused() -> None:
    values: list[P.EValue] = [planned(0, [1, 1, 4, 4]), P.IntList([8, 8]), P.IntList([8, 8]),
                              P.IntList([]), P.Bool(False), P.Bool(True), P.Null(),
                              planned(64, [1, 1, 2, 2]), P.Int(2), P.Int(0)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 4, 5, 6, 7, 7])],
                    ["aten::avg_pool2d.out"], inputs=[0], outputs=[7])
    with pytest.raises(FormatError, match=r"argument 'padding' expects 2 items \(int\[2\]\), "
                                          r"but value 3, an IntList, has 0"):
        load(serialize(program))


def test_int_1_lists_take_any_length() -> None:
    # `int[1] dim` of a reduction is one dim or several.
    values: list[P.EValue] = [planned(0, [2, 3]), P.IntList([4, 5]), P.Bool(False), P.Null(),
                              P.Int(0), P.Int(1), planned(32, [])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 6, 6])], ["aten::sum.IntList_out"],
                    inputs=[0], outputs=[6])
    x = torch.arange(6.0).reshape(2, 3)
    (out,) = load(serialize(program)).run("forward", [x])
    assert torch.equal(out, x.sum())


def test_bool_3_output_mask() -> None:
    mask = schema_argument("aten::convolution_backward.out", "output_mask")
    assert fixed_length(mask) == 3 and declared_type(mask) == "bool[3]"
    assert fits(mask, 3) and not fits(mask, 2) and not fits(mask, 0)


def test_every_fixed_length_of_the_allowlist_is_enforced() -> None:
    # Each allowlisted `T[N]` (N >= 2) refuses N - 1 items and N + 1.
    seen = 0
    for key in allowlisted_operators():
        kernel = KERNELS.find(*key.rsplit(".", 1))
        assert kernel is not None
        for arg in kernel.schema.arguments:
            if arg.N is not None and arg.N >= 2:
                seen += 1
                assert fits(arg, arg.N) and not fits(arg, arg.N - 1) \
                    and not fits(arg, arg.N + 1), (key, arg.name)
    assert seen >= 15  # pooling, padding, upsampling
