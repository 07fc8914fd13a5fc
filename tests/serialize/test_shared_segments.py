"""Segments that share bytes (`DataSegment.inside`): a named-data entry whose
bytes are a constant buffer's is stored once, inside the constant segment;
the reader finds it there again, so files round-trip byte for byte; a
segment whose bytes are no longer its holder's is stored on its own."""

from __future__ import annotations

import exirc.serialize.program as P
from exirc.serialize import deserialize, read_program_file
from exirc.serialize.reader import segments_inside
from exirc.serialize.writer import serialize

WEIGHT = bytes(range(256)) * 4


def _program(inside: tuple[int, int] | None) -> P.Program:
    data, offsets = P.pack_subsegments([b"", b"\x01" * 20, WEIGHT], P.CONSTANT_ALIGNMENT)
    program = P.Program(segments=[P.DataSegment(data)],
                        constant_segment=P.SubsegmentOffsets(0, offsets))
    program.add_named_segment("other", b"\x02" * 100)
    program.add_named_segment("weight", WEIGHT, inside)
    return program


def test_a_segment_inside_another_is_stored_once() -> None:
    offset = _program(None).constant_segment.offsets[2]  # type: ignore[union-attr]
    alone, shared = serialize(_program(None)), serialize(_program((0, offset)))
    assert len(alone) - len(shared) >= len(WEIGHT)
    assert shared.count(WEIGHT) == 1

    read = read_program_file(shared)
    program = read.program
    assert program.named_segment("weight") == WEIGHT
    assert program.constant_data(2)[:len(WEIGHT)] == WEIGHT
    start, _ = read.segment_spans[0]
    assert read.segment_spans[2] == (start + offset, len(WEIGHT))
    # Read back, the segment is inside the constants again: the same bytes.
    assert program.segments[2].inside == (0, offset)
    assert serialize(deserialize(shared)) == shared


def test_a_segment_no_longer_inside_its_holder_is_stored_on_its_own() -> None:
    offset = _program(None).constant_segment.offsets[2]  # type: ignore[union-attr]
    program = _program((0, offset + 4))  # not where the bytes are
    data = serialize(program)
    assert data.count(WEIGHT) == 2
    assert deserialize(data).named_segment("weight") == WEIGHT
    assert deserialize(data).segments[2].inside is None


def test_the_holder_is_the_first_widest_segment() -> None:
    spans = [(0, 100), (200, 10), (10, 20), (0, 100), (95, 10), (210, 0)]
    assert segments_inside(spans) == {2: (0, 10), 3: (0, 0)}
