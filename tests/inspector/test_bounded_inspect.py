"""`exirc inspect` on hostile files: metadata it cannot read is a format error
naming the segment, never a raw traceback; its work and memory stay in
proportion to the file.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from exirc.cli.app import main
from exirc.runtime import load
from exirc.serialize import bundled_cases, constant_names, deserialize, symbolic_shapes
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests import many_entries
from tests.cli.test_conventions import run
from tests.programs import add_constant_program
from tests.serialize import hostile as H

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


# --------------------------------------------------------------------------
# Memory: every view, through the real command line, on files of many entries.
# --------------------------------------------------------------------------

# All text views at once (with the HTML picture), and all of --json: each run
# holds what its views need together, so it bounds every view alone.
ALL_TEXT = ["--show", "summary", "--show", "instructions", "--show", "memory", "--show", "size",
            "--show", "quantization"]
ALL_JSON = ["--json", *ALL_TEXT]


@pytest.fixture(scope="module")
def many_files() -> dict[str, tuple[Path, int]]:
    return many_entries.shared_files()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(many_entries.GENERATORS))
@pytest.mark.parametrize("views", ["text", "json"])
def test_inspect_memory_follows_the_file(many_files: dict[str, tuple[Path, int]], name: str,
                                         views: str, tmp_path: Path) -> None:
    path, size = many_files[name]
    args = [*ALL_TEXT, "--memory-plan", str(tmp_path / "plan.html")] if views == "text" \
        else ALL_JSON
    growth = many_entries.cli_peak_growth(["inspect", str(path), *args])
    allowed = many_entries.budget_for(name, size)
    assert growth <= allowed, (f"inspect ({views}) of {name} ({size >> 10} KiB) peaked "
                               f"{growth >> 20} MiB above its imports; allowed {allowed >> 20}")


def test_memory_view_work_is_linear_in_buffers_and_instructions(tmp_path: Path) -> None:
    # Per-arena per-instruction tables made this 20k x 20k = 400M entries.
    path = tmp_path / "wide.pte"
    many_entries.write(many_entries.many_buffers(20_000, instructions=20_000), path)
    start = time.process_time()  # CPU time, which a busy machine does not stretch
    code = main(["inspect", str(path), "--show", "memory", "--json"])
    assert code == 0
    assert time.process_time() - start < 60  # 2.5 s; gigabytes and minutes before


def test_a_plan_of_many_loops_is_bounded_work(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    # 10,000 loops, each back to the start, over 10,000 relus of their own
    # tensors: extending lifetimes loop by loop was loops x values x rounds,
    # and indenting the listing loops x instructions.
    count = 10_000
    values: list[P.EValue] = [P.Bool(True)]
    values += [P.Tensor(P.ScalarType.FLOAT, [4], [0],
                        allocation_info=P.AllocationDetails.at(1, 16 * i))
               for i in range(2 * count)]
    instructions: list[P.Instruction] = []
    for i in range(count):
        instructions.append(P.KernelCall(0, [1 + 2 * i, 2 + 2 * i, 2 + 2 * i]))
        instructions.append(P.JumpFalseCall(0, 0))
    plan = P.ExecutionPlan("forward", values, [1], [2], [P.Chain([1], [2], instructions)],
                           [P.Operator("aten::relu", "out")],
                           non_const_buffer_sizes=[0, 32 * count])
    path = tmp_path / "loops.pte"
    path.write_bytes(serialize(P.Program(execution_plan=[plan])))
    start = time.process_time()  # CPU time, which a busy machine does not stretch
    code, out, err = run(capsys, "inspect", str(path), "--show", "memory",
                         "--show", "instructions")
    assert code == 0, err
    assert f"{count} loops" in out and "lifetimes cover whole loop regions" in out
    assert time.process_time() - start < 20  # 40 s when it was loops x values


def _values_sharing_one_list(count: int, items: int) -> bytes:
    """A program whose values 3.. are `count` entries pointing at the one
    TensorList table of value 2 (`items` items): a file of ~4 bytes a value
    whose values would each copy and check `items` items."""
    tensor = P.Tensor(P.ScalarType.FLOAT, [4], [0], allocation_info=P.AllocationDetails.at(1, 0))
    out = P.Tensor(P.ScalarType.FLOAT, [4], [0], allocation_info=P.AllocationDetails.at(1, 16))
    values: list[P.EValue] = [tensor, out, P.TensorList([0] * items)]
    values += [P.Null()] * count
    plan = P.ExecutionPlan("forward", values, [0], [1],
                           [P.Chain([0], [1], [P.KernelCall(0, [0, 1, 1])])],
                           [P.Operator("aten::relu", "out")], non_const_buffer_sizes=[0, 32])
    encoded = H.encode(P.Program(execution_plan=[plan]))
    data = encoded.data
    vector = encoded.at("execution_plan[0].values")
    target = encoded.at("execution_plan[0].values[2]")
    for k in range(3, 3 + count):
        entry = vector + 4 + 4 * k
        data = H.put_u32(data, entry, target - entry)
    return data


def test_values_sharing_one_long_list_cost_it_once(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    count, items = 50_000, 20_000  # a billion items, were each value its own list
    data = _values_sharing_one_list(count, items)
    program = deserialize(data)
    values = program.execution_plan[0].values
    # Read at most twice (the first use, then once more to keep), then shared.
    assert values[2] == values[3] and all(v is values[3] for v in values[4:])
    start = time.process_time()  # CPU time, which a busy machine does not stretch
    method = load(data).method("forward")
    assert method.value(count + 2) is method.value(3)
    path = tmp_path / "shared.pte"
    path.write_bytes(data)
    for args in (ALL_TEXT, ALL_JSON):
        code, _, err = run(capsys, "inspect", str(path), *args)
        assert code == 0, err
    assert time.process_time() - start < 30
