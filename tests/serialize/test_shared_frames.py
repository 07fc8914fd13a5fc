"""Instructions from one source line share one stored frame list."""

from __future__ import annotations

import copy

from exirc.serialize import deserialize
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program


def _repeated(times: int) -> P.Program:
    """add_constant_program's add, `times` times over, all from one line."""
    program = add_constant_program()
    chain = program.execution_plan[0].chains[0]
    chain.instructions = [copy.deepcopy(chain.instructions[0]) for _ in range(times)]
    chain.stacktrace = [copy.deepcopy(chain.stacktrace[0]) for _ in range(times)]
    return program


def test_a_repeated_frame_is_stored_once_and_read_back_for_every_instruction() -> None:
    data = serialize(_repeated(40))
    assert data.count(b"return x + self.w") == 1
    assert data.count(b"model.py") == 1
    chain = deserialize(data).execution_plan[0].chains[0]
    assert len(chain.stacktrace) == 40
    assert all(frames.items == [P.Frame("model.py", 12, "forward", "return x + self.w")]
               for frames in chain.stacktrace)


def _bytes_per_instruction(with_frames: bool) -> float:
    def size(times: int) -> int:
        program = _repeated(times)
        if not with_frames:
            program.execution_plan[0].chains[0].stacktrace = []
        return len(serialize(program))
    return (size(101) - size(1)) / 100


def test_frames_cost_an_instruction_one_reference() -> None:
    extra = _bytes_per_instruction(True) - _bytes_per_instruction(False)
    assert extra <= 4  # a 4-byte offset into the stacktrace vector, no new table
