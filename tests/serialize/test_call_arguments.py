"""A call's arguments as the reader keeps them: `P.Args`, int32s in one block,
which are the list of the same indices to everything that reads a program."""

from __future__ import annotations

import copy
import json
import pickle
import sys

from exirc.inspector.describe import describe
from exirc.serialize import deserialize, read_program_file
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program


def _calls(program: P.Program) -> list[P.KernelCall]:
    return [instr for instr in program.execution_plan[0].chains[0].instructions
            if isinstance(instr, P.KernelCall)]


def test_read_arguments_are_int32s_equal_to_the_list_written() -> None:
    program = add_constant_program()
    data = serialize(program)
    read = deserialize(data)
    (call,) = _calls(read)
    (written,) = _calls(program)
    assert isinstance(call.args, P.Args) and isinstance(written.args, list)
    assert call.args == written.args and written.args == call.args
    assert [call.args != written.args, written.args != call.args] == [False, False]
    assert call.args != written.args[:-1] and call.args != [*written.args[:-1], 99]
    assert repr(call) == repr(written)  # listings and messages show the list
    assert serialize(read) == data


def test_copies_of_arguments_stay_arguments() -> None:
    args = P.Args([4, 5, 6])
    for made in (copy.copy(args), copy.deepcopy(args), pickle.loads(pickle.dumps(args))):
        assert type(made) is P.Args and made == [4, 5, 6] and made is not args


def test_equal_arguments_are_one_block_edited_only_as_a_copy() -> None:
    program = add_constant_program()
    chain = program.execution_plan[0].chains[0]
    chain.instructions.append(copy.deepcopy(chain.instructions[0]))
    chain.stacktrace.append(copy.deepcopy(chain.stacktrace[0]))
    first, second = _calls(deserialize(serialize(program)))
    assert first.args is second.args  # as equal short lists are shared
    second.args = list(second.args)  # its own, then edited
    second.args[0] = 1
    assert first.args == _calls(program)[0].args


def test_arguments_cost_less_than_a_list_of_their_ints() -> None:
    indices = [100_000, 100_001, 100_002]  # each its own int object in a list
    as_list = sys.getsizeof(indices) + sum(sys.getsizeof(i) for i in indices)
    assert sys.getsizeof(P.Args(indices)) < as_list * 2 // 3


def test_the_inspector_lists_read_arguments_as_json() -> None:
    (method,) = describe(read_program_file(serialize(add_constant_program())))["methods"]
    (call,) = [instr for instr in method["instructions"] if instr["kind"] == "KernelCall"]
    assert json.loads(json.dumps(call["args"])) == _calls(add_constant_program())[0].args
