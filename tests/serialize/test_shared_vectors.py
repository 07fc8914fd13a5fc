"""Equal scalar vectors (tensor sizes, dim orders, call arguments) are stored
once and shared by every table using them; exirc's reader and ExecuTorch's
runtime read a file that shares them like any other."""

from __future__ import annotations

import copy
import struct

from exirc.serialize import deserialize, read_program_file
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.oracle import requires_executorch
from tests.programs import add_constant_program, assert_add_constant_runs_on_both_runtimes

_SIZES = [3, 5, 7, 11]  # bytes that occur nowhere else in the file


def _tensors(count: int) -> P.Program:
    """add_constant_program with `count` extra (unused) tensors of sizes _SIZES."""
    program = add_constant_program()
    plan = program.execution_plan[0]
    plan.values += [P.Tensor(P.ScalarType.FLOAT, list(_SIZES), [0, 1, 2, 3])
                    for _ in range(count)]
    return program


def test_equal_sizes_are_stored_once_and_read_back_for_every_tensor() -> None:
    data = serialize(_tensors(30))
    assert data.count(struct.pack("<4i", *_SIZES)) == 1
    values = deserialize(data).execution_plan[0].values
    assert [v.sizes for v in values[4:]] == [_SIZES] * 30  # type: ignore[union-attr]
    assert [v.dim_order for v in values[4:]] == [[0, 1, 2, 3]] * 30  # type: ignore[union-attr]


def test_a_shared_vector_costs_a_tensor_no_bytes_of_its_own() -> None:
    # Each further tensor costs its table and its value, not its vectors.
    per_tensor = (_flatbuffer_size(_tensors(101)) - _flatbuffer_size(_tensors(1))) / 100
    assert per_tensor < 64
    unshared = copy.deepcopy(_tensors(2))
    unshared.execution_plan[0].values[-1].sizes = [13, 17, 19, 23]  # type: ignore[union-attr]
    # its own vector: a length and four items (less whatever padding it fills)
    assert _flatbuffer_size(unshared) - _flatbuffer_size(_tensors(2)) >= 16


def _flatbuffer_size(program: P.Program) -> int:
    # The file's size moves in steps of the segment alignment.
    return read_program_file(serialize(program)).program_size


def test_equal_lists_of_different_element_types_are_not_confused() -> None:
    program = add_constant_program()
    plan = program.execution_plan[0]
    # value 2 is an Int, 0 and 1 tensors: the same items as int32, int64 and
    # bool vectors
    plan.values += [P.IntList([2, 2, 2]), P.Tensor(P.ScalarType.FLOAT, [2, 2, 2], [0, 1, 2]),
                    P.TensorList([0, 1, 0]), P.BoolList([False, True, False])]
    read = deserialize(serialize(program)).execution_plan[0].values[4:]
    assert read == plan.values[4:]


@requires_executorch
def test_a_program_sharing_vectors_runs_on_executorch_and_exirc() -> None:
    program = add_constant_program()  # input, output and the constant share [2, 3] and [0, 1]
    data = serialize(program)
    assert data.count(struct.pack("<3i", 2, 2, 3)) == 1  # length 2: 2, 3
    assert_add_constant_runs_on_both_runtimes(data)
