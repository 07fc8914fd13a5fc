"""The symbolic-shapes segment: round trip, safe evaluation, hostile contents."""

from __future__ import annotations

import json

import pytest

from exirc.errors import FormatError
from exirc.serialize import deserialize, metadata
from exirc.serialize import program as P
from exirc.serialize.symbolic_shapes import (
    NAMED_DATA_KEY,
    MethodShapes,
    SymbolRange,
    bind_symbols,
    decode,
    encode,
    evaluate,
    upper_bound,
)
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program as add_program


def test_round_trip_through_a_program_file() -> None:
    shapes = {"forward": MethodShapes({"s0": SymbolRange(1, 64), "s1": SymbolRange(2, None)},
                                      {0: ["s0", 8], 3: ["2*s0", "s1//2 + 1"]})}
    program = add_program()
    program.add_named_segment(NAMED_DATA_KEY, encode(shapes))
    data = serialize(program)
    read = metadata.stored(deserialize(data), NAMED_DATA_KEY)
    assert read is not None and decode(read) == shapes
    assert data == serialize(deserialize(data))  # stable bytes


def test_dims_are_described_with_their_bounds() -> None:
    shapes = MethodShapes({"s0": SymbolRange(1, 64)}, {4: ["s0", 8], 5: ["2*s0 + 1"]})
    assert shapes.describe_dims(4) == ["s0<=64", "8"]
    assert shapes.describe_dims(5) == ["2*s0 + 1<=129"]
    assert shapes.describe_dims(6) is None
    assert upper_bound("s0//2", {"s0": SymbolRange(1, None)}) is None


@pytest.mark.parametrize(("expression", "symbols", "value"), [
    ("2*s0", {"s0": 3}, 6),
    ("s0//2 + 1", {"s0": 7}, 4),
    ("Mod(s0, 3) + Max(s0, s1)", {"s0": 7, "s1": 9}, 10),
    ("-s0 + 10", {"s0": 4}, 6),
    ("s0 + s1", {"s0": 4}, None),  # s1 unknown
    ("s0//0", {"s0": 4}, None),
])
def test_evaluation(expression: str, symbols: dict[str, int], value: int | None) -> None:
    assert evaluate(expression, symbols) == value


def test_symbols_are_learnt_from_whole_dims_only() -> None:
    bound: dict[str, int] = {}
    bind_symbols(["s0", 8, "2*s1"], (5, 8, 12), bound)
    assert bound == {"s0": 5}


def _segment(methods: object) -> bytes:
    return json.dumps({"format_version": 1, "methods": methods}).encode()


@pytest.mark.parametrize("data", [
    b"not json",
    b"[]",
    json.dumps({"format_version": 2, "methods": {}}).encode(),
    _segment({"forward": {"symbols": {"s0": [1, "64"]}, "values": {}}}),
    _segment({"forward": {"symbols": {}, "values": {"x": ["s0"]}}}),
    _segment({"forward": {"symbols": {}, "values": {"0": ["__import__('os').system('x')"]}}}),
    _segment({"forward": {"symbols": {}, "values": {"0": ["s0.__class__"]}}}),
    _segment({"forward": {"symbols": {}, "values": {"0": ["9" * 500]}}}),
    _segment({"forward": {"symbols": {}, "values": {"0": [1.5]}}}),
    b" " * (5 << 20),
])
def test_hostile_segments_are_format_errors(data: bytes) -> None:
    with pytest.raises(FormatError, match="named_data"):
        decode(data)


def test_a_program_with_a_hostile_segment_is_refused_at_load() -> None:
    from exirc.runtime import load

    program: P.Program = add_program()
    program.add_named_segment(NAMED_DATA_KEY, b'{"format_version": 1, "methods": 7}')
    with pytest.raises(FormatError):
        load(serialize(program))


def test_a_segment_without_ranges_still_bounds_inputs_by_their_planned_size() -> None:
    # A crafted segment naming a dim `s0` but giving no range for it must not
    # let an input outgrow its planned memory.
    import numpy

    from exirc.errors import InputError
    from exirc.runtime import load

    program = add_program()
    plan = program.execution_plan[0]
    x = plan.values[plan.inputs[0]]
    assert isinstance(x, P.Tensor)
    x.shape_dynamism = P.TensorShapeDynamism.DYNAMIC_BOUND
    program.add_named_segment(NAMED_DATA_KEY, encode(
        {"forward": MethodShapes({}, {plan.inputs[0]: ["s0", 3]})}))
    method = load(serialize(program)).method("forward")
    with pytest.raises(InputError, match="dim 0 may be at most 2"):
        method.run([numpy.zeros((9, 3), numpy.float32)])
