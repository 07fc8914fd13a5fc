"""Packed segments (exirc's metadata, needing no alignment) go in the padding
between aligned segments where they fit, else after them all; the reader
tells them from the aligned ones, the same bytes are written again, and
ExecuTorch's runtime loads and runs such a file."""

from __future__ import annotations

from exirc.serialize import deserialize, read_program_file
from exirc.serialize import program as P
from exirc.serialize.header import SEGMENT_ALIGNMENT
from exirc.serialize.writer import serialize
from tests.oracle import requires_executorch
from tests.programs import add_constant_program, assert_add_constant_runs_on_both_runtimes

_BLOB = bytes(range(200))


def _program(small: int, large: int) -> P.Program:
    """add_constant_program (its constants: a segment shorter than the
    alignment), an aligned named segment after it, and packed segments of
    `small` and `large` bytes."""
    program = add_constant_program()
    program.add_named_segment("blob", _BLOB)
    program.add_named_segment("small", b"s" * small, packed=True)
    program.add_named_segment("large", b"L" * large, packed=True)
    return program


def _spans(data: bytes) -> dict[str, tuple[int, int]]:
    read = read_program_file(data)
    base = read.header.segment_base_offset  # type: ignore[union-attr]
    spans = {e.key: read.segment_spans[e.segment_index] for e in read.program.named_data}
    return {key: (start - base, size) for key, (start, size) in spans.items()}


def test_a_packed_segment_goes_in_the_padding_it_fits() -> None:
    program = _program(small=20, large=300)
    data = serialize(program)
    spans = _spans(data)
    constants = len(program.segments[0].data)
    assert constants % SEGMENT_ALIGNMENT
    assert spans["small"][0] == constants  # in the padding after the constants
    assert spans["blob"][0] == SEGMENT_ALIGNMENT * -(-constants // SEGMENT_ALIGNMENT)
    assert spans["large"][0] > spans["blob"][0]  # too big for any padding: after them all
    read = deserialize(data)
    assert [s.packed for s in read.segments][:4] == [False, False, True, True]
    assert serialize(read) == data  # read and written again: the same bytes


def test_a_packed_segment_never_ends_where_an_aligned_one_starts() -> None:
    constants = len(add_constant_program().segments[0].data)
    fills = -constants % SEGMENT_ALIGNMENT  # exactly the padding
    data = serialize(_program(small=fills, large=1))
    spans = _spans(data)
    assert spans["small"][0] > spans["blob"][0]
    assert spans["large"][0] == constants  # the 1-byte one fits
    read = deserialize(data)
    assert not read.segments[1].packed and read.segments[2].packed
    assert serialize(read) == data


@requires_executorch
def test_executorch_runs_a_file_with_segments_in_the_padding() -> None:
    data = serialize(_program(small=20, large=300))
    assert _spans(data)["small"][0] % SEGMENT_ALIGNMENT
    assert_add_constant_runs_on_both_runtimes(data)
