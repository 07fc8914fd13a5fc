"""Instructions from one source line share one stored frame list (in the
`exirc.metadata` segment; files from before hold it in the chains)."""

from __future__ import annotations

import copy

import pytest

from exirc.serialize import deserialize, metadata
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


@pytest.mark.parametrize("merged", [True, False], ids=["metadata segment", "older layout"])
def test_a_repeated_frame_is_stored_once_and_read_back_for_every_instruction(
        merged: bool) -> None:
    data = serialize(_repeated(40), metadata_segment=merged)
    if merged:
        stored = metadata.decompress(
            deserialize(data).named_segment(metadata.NAMED_DATA_KEY) or b"")
        assert b"return x + self.w" not in data
    else:
        stored = data
    assert stored.count(b"return x + self.w") == 1
    assert stored.count(b"model.py") == 1
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
