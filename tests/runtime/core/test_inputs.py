"""Inputs are checked against the method's signature before anything runs.

Each bad input has a test asserting what the user is told; arrays in any
layout numpy can produce simply work.
"""

from __future__ import annotations

import numpy
import pytest
import torch

from exirc.errors import InputError
from exirc.runtime import LoadedProgram, load
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program
from tests.runtime.core.test_interpreter import build, loop_program, planned

W = torch.tensor([[0.5, -1.0, 2.0], [3.5, 0.0, -0.25]])


@pytest.fixture(scope="module")
def add() -> LoadedProgram:
    """forward(x: f32[2, 3]) = x + W."""
    return load(serialize(add_constant_program()))


@pytest.fixture(scope="module")
def dynamic() -> LoadedProgram:
    """forward(x: f32[<=4, <=3]) = relu(x)."""
    values: list[P.EValue] = [planned(0, [4, 3], dynamic=True), planned(48, [4, 3], dynamic=True)]
    program = build(values, [P.KernelCall(0, [0, 1, 1])], ["aten::relu.out"],
                    inputs=[0], outputs=[1], arena=96)
    return load(serialize(program))


def message(program: LoadedProgram, inputs: object) -> str:
    with pytest.raises(InputError) as caught:
        program.run("forward", inputs)  # type: ignore[arg-type]
    return str(caught.value)


def test_wrong_count(add: LoadedProgram) -> None:
    with pytest.raises(InputError) as caught:
        add.run("forward", [torch.zeros(2, 3), torch.zeros(2, 3)])
    assert str(caught.value) == "method 'forward' takes 1 input, got 2"
    assert caught.value.hint == "the method's inputs: input_0: f32[2, 3]"
    assert message(add, []) == "method 'forward' takes 1 input, got 0"


def test_wrong_dtype(add: LoadedProgram) -> None:
    assert message(add, [numpy.zeros((2, 3))]) == (
        "input_0 has dtype float64, expected float32 (f32[2, 3])")
    assert message(add, [torch.zeros(2, 3, dtype=torch.int64)]) == (
        "input_0 has dtype int64, expected float32 (f32[2, 3])")
    assert message(add, [numpy.zeros((2, 3), dtype=numpy.complex64)]) == (
        "input_0 has dtype complex64, expected float32 (f32[2, 3])")


def test_wrong_rank(add: LoadedProgram) -> None:
    assert message(add, [torch.zeros(1, 2, 3)]) == (
        "input_0 has rank 3 (shape [1, 2, 3]), expected rank 2 (f32[2, 3])")


def test_wrong_shape(add: LoadedProgram) -> None:
    assert message(add, [torch.zeros(3, 2)]) == (
        "input_0 has shape [3, 2], expected [2, 3] (f32[2, 3])")


def test_not_an_array(add: LoadedProgram) -> None:
    assert message(add, [[1.0, 2.0]]) == (
        "input_0 must be a tensor or numpy array (f32[2, 3]), got list")
    assert message(add, "x") == "inputs must be a sequence or a mapping by name, got str"


def test_inputs_by_name(add: LoadedProgram) -> None:
    (out,) = add.run("forward", {"input_0": torch.zeros(2, 3)})
    assert torch.equal(out, W)
    assert message(add, {"x": torch.zeros(2, 3)}) == (
        "method 'forward' takes inputs named input_0, got x")


def test_dynamic_shape_within_and_beyond_its_bounds(dynamic: LoadedProgram) -> None:
    for rows in (1, 4, 2):
        x = torch.randn(rows, 3)
        (out,) = dynamic.run("forward", [x])
        assert torch.equal(out, torch.relu(x))
    assert message(dynamic, [torch.zeros(5, 3)]) == (
        "input_0 has shape [5, 3], but dim 0 may be at most 4 (f32[<=4, <=3])")
    assert message(dynamic, [torch.zeros(4)]) == (
        "input_0 has rank 1 (shape [4]), expected rank 2 (f32[<=4, <=3])")


def test_scalar_inputs() -> None:
    program = load(serialize(loop_program()))
    assert program.method("forward").signature() == "input_0: f32[2], input_1: int"
    (out,) = program.run("forward", [torch.ones(2), numpy.int64(2)])
    assert out.tolist() == [2.0, 2.0]
    assert message(program, [torch.ones(2), 2.5]) == "input_1 must be a single int, got float 2.5"
    assert message(program, [torch.ones(2), True]) == "input_1 must be a single int, got bool True"
    assert message(program, [torch.ones(2), torch.ones(2)]).startswith(
        "input_1 must be a single int, got Tensor")


@pytest.mark.parametrize("layout", ["transposed", "fortran", "reversed", "strided", "big-endian",
                                    "read-only", "tensor-view"])
def test_any_layout_simply_works(add: LoadedProgram, layout: str) -> None:
    base = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    arrays = {
        "transposed": numpy.ascontiguousarray(base.T).T,
        "fortran": numpy.asfortranarray(base),
        "reversed": numpy.flip(numpy.flip(base, 0).copy(), 0),  # negative strides
        "strided": numpy.repeat(base, 2, axis=1)[:, ::2],
        "big-endian": base.astype(">f4"),
        "read-only": base.copy(),
        "tensor-view": torch.arange(12, dtype=torch.float32).reshape(3, 4).T[:3, :2].T,
    }
    value = arrays[layout]
    if layout == "read-only":
        value.flags.writeable = False
    expected = torch.arange(6, dtype=torch.float32).reshape(2, 3) + W
    if layout == "tensor-view":
        expected = value + W
    (out,) = add.run("forward", [value])
    assert torch.equal(out, expected)


def test_a_rejected_input_changes_nothing(add: LoadedProgram) -> None:
    add.run("forward", [torch.ones(2, 3)])
    with pytest.raises(InputError):
        add.run("forward", [torch.zeros(3, 3)])
    x = add.method("forward").value(0)
    assert torch.equal(x, torch.ones(2, 3))


@pytest.mark.parametrize("view", ["whole", "offset", "transposed"])
def test_a_tensor_whose_storage_was_shrunk_is_refused_not_read(add: LoadedProgram,
                                                              view: str) -> None:
    # Reading such a tensor reads freed memory (eager PyTorch crashes on it); the
    # views check the extent of storage offsets and strides, not just the size.
    base = torch.arange(12, dtype=torch.float32)
    value = {"whole": base[:6].view(2, 3), "offset": base[6:].view(2, 3),
             "transposed": base[:6].view(3, 2).T}[view]
    (out,) = add.run("forward", [value])
    assert torch.equal(out, value + W)
    base.untyped_storage().resize_(44)  # one element short of the offset view's end
    if view != "offset":
        (out,) = add.run("forward", [value])  # still within what remains
        assert torch.equal(out, value + W)
    else:
        assert "its storage was shrunk" in message(add, [value])
    base.untyped_storage().resize_(0)
    assert message(add, [value]) == (
        f"input_0 addresses {24 if view != 'offset' else 48} bytes of its storage, which holds 0: "
        "its storage was shrunk (untyped_storage().resize_) under it, and reading it would read "
        "freed memory")
