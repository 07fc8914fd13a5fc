"""`exirc inspect` on hostile files: metadata it cannot read is a format error
naming the segment, never a raw traceback; its work and memory stay in
proportion to the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exirc.serialize import bundled_cases, constant_names, symbolic_shapes
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.programs import add_constant_program

DEEP = 100_000  # far past Python's recursion limit


def _with_segment(tmp_path: Path, key: str, data: bytes) -> Path:
    program = add_constant_program()
    program.add_named_segment(key, data)
    path = tmp_path / "hostile.pte"
    path.write_bytes(serialize(program))
    return path


def _bundle(header: bytes) -> bytes:
    prefix = bundled_cases._PREFIX.pack(bundled_cases.MAGIC, bundled_cases.FORMAT_VERSION,
                                        len(header))
    return prefix + header


def _deep_json(inside: str) -> bytes:
    return ('{"format_version":1,' + inside + ":" + "[" * DEEP + "]" * DEEP + "}").encode()


@pytest.mark.parametrize("key, data", [
    (symbolic_shapes.NAMED_DATA_KEY, _deep_json('"methods"')),
    (constant_names.NAMED_DATA_KEY, _deep_json('"buffers"')),
    (bundled_cases.NAMED_DATA_KEY, _bundle(("[" * DEEP + "]" * DEEP).encode())),
], ids=["symbolic shapes", "constant names", "bundled cases"])
@pytest.mark.parametrize("view", ["summary", "size"])
def test_deeply_nested_metadata_is_a_format_error(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path, key: str, data: bytes,
                                                  view: str) -> None:
    path = _with_segment(tmp_path, key, data)
    code, _, err = run(capsys, "inspect", str(path), "--show", view)
    if key == constant_names.NAMED_DATA_KEY and view == "summary":
        assert code == 0, err  # only the size report reads constant names
        return
    assert code == 3, err
    assert "nested too deeply" in err and key in err
    assert "Traceback" not in err


def _shapes(lower: object, upper: object, dims: object = "s0") -> bytes:
    return symbolic_shapes.json_segment.dump({"methods": {"forward": {
        "symbols": {"s0": [lower, upper]}, "values": {"0": [dims, 3]}}}}, 1)


@pytest.mark.parametrize("data", [
    _shapes(2, 10**4000), _shapes(-(10**4000), 4), _shapes(2, 8, 10**300)],
    ids=["upper bound", "lower bound", "static dim"])
def test_absurd_symbol_bounds_are_refused_at_decode(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path, data: bytes) -> None:
    path = _with_segment(tmp_path, symbolic_shapes.NAMED_DATA_KEY, data)
    for args in ([], ["--json"], ["--show", "instructions"]):
        code, _, err = run(capsys, "inspect", str(path), *args)
        assert code == 3, err
        assert "an integer beyond int64 is not a size or a bound" in err


def test_expressions_past_int64_have_no_bound(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    big = (1 << 62)
    data = _shapes(2, big, "s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0")
    path = _with_segment(tmp_path, symbolic_shapes.NAMED_DATA_KEY, data)
    code, out, err = run(capsys, "inspect", str(path), "--show", "instructions")
    assert code == 0, err
    assert f"<={big}" not in out
    assert symbolic_shapes.upper_bound("s0*s0", {"s0": symbolic_shapes.SymbolRange(2, big)}) \
        is None
    assert symbolic_shapes.upper_bound("2*s0", {"s0": symbolic_shapes.SymbolRange(2, 7)}) == 14


@pytest.mark.parametrize("value, message", [
    ('{"int": ' + "9" * 4000 + "}", "is not a value"),
    ('{"dtype": "float32", "shape": [' + ", ".join(["9" * 4000] * 4) + '], "offset": 0}',
     "is not a shape"),
    ('{"dtype": "float32", "shape": [2], "offset": ' + "9" * 4000 + "}", "is not an offset"),
], ids=["int", "shape", "offset"])
def test_bundled_ints_beyond_int64_are_format_errors(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path, value: str,
                                                     message: str) -> None:
    header = ('{"rtol": 0.001, "atol": ' + "9" * 4000 + ', "cases": []}').encode()
    path = _with_segment(tmp_path, bundled_cases.NAMED_DATA_KEY, _bundle(header))
    code, _, err = run(capsys, "inspect", str(path))
    assert code == 3 and "an integer beyond int64 is not a tolerance" in err, err
    header = ('{"rtol": 0.001, "atol": 0.001, "cases": [{"method": "forward", "inputs": ['
              + value + '], "outputs": []}]}').encode()
    path = _with_segment(tmp_path, bundled_cases.NAMED_DATA_KEY, _bundle(header))
    code, _, err = run(capsys, "inspect", str(path))
    assert code == 3 and message in err, err
    assert "Traceback" not in err
