"""Size report: every byte of the file in exactly one row, figures known by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from exirc.inspector.size import size_report
from exirc.inspector.size_constant_names import ConstantUse
from exirc.inspector.size_rows import SizeReport
from exirc.serialize import program as P
from exirc.serialize import read_program_file
from exirc.serialize.header import HEADER_LENGTH, SEGMENT_ALIGNMENT
from exirc.serialize.program import CONSTANT_ALIGNMENT
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.programs import control_flow_program

F32 = P.ScalarType.FLOAT
WEIGHT = struct.pack("<6f", 0.5, -1.0, 2.0, 3.5, 0.0, -0.25)  # 24 B
BIAS = struct.pack("<2f", 1.0, 2.0)  # 8 B


def constant(sizes: list[int], index: int, **kw: object) -> P.Tensor:
    return P.Tensor(F32, sizes, list(range(len(sizes))), data_buffer_idx=index,
                    **kw)  # type: ignore[arg-type]


def planned(sizes: list[int], offset: int) -> P.Tensor:
    return P.Tensor(F32, sizes, list(range(len(sizes))),
                    allocation_info=P.AllocationDetails.at(1, offset))


def twin_weights_program(*, inline: bool = False) -> P.Program:
    """forward(x) = (x + W1) + W2 + B, where W1 and W2 hold identical bytes.

    Constant segment (16-byte aligned): buffer 0 empty at 0, W1 at 0 (24 B),
    W2 at 32 (24 B), B at 64 (8 B): 72 B, of which 16 B alignment padding.
    """
    values: list[P.EValue] = [
        planned([2, 3], 0),      # %0 x
        constant([2, 3], 1),     # %1 W1
        constant([2, 3], 2),     # %2 W2, the same bytes as W1
        constant([2], 3),        # %3 B
        P.Int(1),                # %4 alpha
        planned([2, 3], 32),     # %5
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(0, [0, 1, 4, 5, 5]),
        P.KernelCall(0, [5, 2, 4, 5, 5]),
        P.KernelCall(1, [5, 3, 4, 5, 5]),
    ]
    plan = P.ExecutionPlan(
        name="forward", values=values, inputs=[0], outputs=[5],
        chains=[P.Chain([0], [5], instructions)],
        operators=[P.Operator("aten::add", "out"), P.Operator("aten::add_bias", "out")],
        non_const_buffer_sizes=[0, 64])
    buffers = [b"", WEIGHT, WEIGHT, BIAS]
    if inline:
        return P.Program(execution_plan=[plan], constant_buffer=[P.Buffer(b) for b in buffers])
    data, offsets = P.pack_subsegments(buffers, CONSTANT_ALIGNMENT)
    assert offsets == [0, 0, 32, 64] and len(data) == 72
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(data)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def report_of(program: P.Program, **kw: object) -> tuple[bytes, SizeReport]:
    data = serialize(program)
    return data, size_report(data, **kw)  # type: ignore[arg-type]


def rows_by_item(report: SizeReport) -> dict[str, int]:
    return {row.item: row.nbytes for row in report.rows}


def test_every_byte_of_a_segmented_file() -> None:
    data, report = report_of(twin_weights_program())
    pf = read_program_file(data)
    assert pf.header is not None
    assert sum(row.nbytes for row in report.rows) == len(data) == report.file_size
    rows = rows_by_item(report)
    assert rows["root offset and file identifier"] == 8
    assert rows["extended header"] == HEADER_LENGTH == 32
    program_rows = [r for r in report.rows if r.group == "program (FlatBuffer)"]
    assert sum(r.nbytes for r in program_rows) == pf.header.program_size - 8 - 32
    assert rows["between the program and the first segment"] == \
        pf.header.segment_base_offset - pf.header.program_size
    assert pf.header.segment_base_offset % SEGMENT_ALIGNMENT == 0
    segment = [r for r in report.rows if r.group == "segment 0: constants"]
    assert [(r.kind, r.nbytes, r.detail.get("buffer")) for r in segment] == [
        ("constant", 24, 1), ("constant", 24, 2), ("constant", 8, 3), ("padding", 16, None)]
    assert segment[0].item == "constant 1: %1 f32[2, 3] used by aten::add.out"
    assert segment[2].item == "constant 3: %3 f32[2] used by aten::add_bias.out"
    # Nothing after the segment: the file ends with it.
    assert "after the last segment" not in rows
    # Instructions: at least the vector of 3 offsets and 3 args vectors of 5 ints.
    instructions = rows["forward: instructions (3 instructions)"]
    assert instructions >= (4 + 3 * 4) + 3 * (4 + 5 * 4)
    assert rows["forward: values (6 values)"] > rows["forward: operators (2 operators)"] > 0


def test_duplicated_constants_are_flagged() -> None:
    _, report = report_of(twin_weights_program())
    (duplicate,) = report.duplicates
    assert duplicate.buffers == [1, 2]
    assert duplicate.nbytes == 24 and duplicate.saving == 24
    assert report.duplicate_bytes == 24
    second = next(r for r in report.rows if r.detail.get("buffer") == 2)
    assert second.detail["duplicate_of"] == 1
    first = next(r for r in report.rows if r.detail.get("buffer") == 1)
    assert "duplicate_of" not in first.detail


def test_named_data_with_a_constants_bytes_is_a_duplicate() -> None:
    program = twin_weights_program()
    program.add_named_segment("weight", BIAS * 3)  # 24 B, unlike W1
    program.add_named_segment("copy", WEIGHT)
    data, report = report_of(program)
    assert sum(row.nbytes for row in report.rows) == len(data)
    (duplicate,) = report.duplicates
    assert duplicate.tensors == ["constant 1", "constant 2", "named data 'copy'"]
    assert duplicate.buffers == [1, 2] and duplicate.saving == 48
    assert report.duplicate_bytes == 48 and report.duplicate_tensors == 2
    named = next(r for r in report.rows if r.item == "named data 'copy'")
    assert named.detail["same_bytes_as"] == "constant 1"


def test_named_data_inside_the_constant_segment_is_shared_not_duplicated() -> None:
    program = twin_weights_program()
    program.add_named_segment("tied", WEIGHT, inside=(0, 32))  # W2's bytes, in place
    data, report = report_of(program)
    assert data.count(WEIGHT) == 2  # W1 and W2; the named data adds none
    assert sum(row.nbytes for row in report.rows) == len(data)
    (duplicate,) = report.duplicates
    assert duplicate.tensors == ["constant 1", "constant 2"]
    second = next(r for r in report.rows if r.detail.get("buffer") == 2)
    assert second.detail["shared_with"] == ["named data 'tied'"]


def test_inline_constants_are_charged_inside_the_program() -> None:
    data, report = report_of(twin_weights_program(inline=True))
    assert read_program_file(data).segment_spans == []
    assert sum(row.nbytes for row in report.rows) == len(data)
    constants = [(r.group, r.nbytes, r.detail["buffer"]) for r in report.rows
                 if r.kind == "constant"]
    assert constants == [("program (FlatBuffer)", 24, 1), ("program (FlatBuffer)", 24, 2),
                         ("program (FlatBuffer)", 8, 3)]
    assert [d.buffers for d in report.duplicates] == [[1, 2]]


def test_names_come_from_pluggable_sources() -> None:
    program = twin_weights_program()
    plan = program.execution_plan[0]
    plan.values[3] = constant([2], 3, extra_tensor_info=P.ExtraTensorInfo(
        fully_qualified_name="linear.bias"))
    _, report = report_of(program)
    assert "constant 3: linear.bias f32[2]" in rows_by_item(report)

    def from_a_table(use: ConstantUse) -> str | None:
        return {1: "linear.weight"}.get(use.tensor.data_buffer_idx)

    _, report = report_of(program, name_sources=(from_a_table,))
    named = {r.detail["buffer"]: r.detail["name"] for r in report.rows if r.kind == "constant"}
    assert named == {1: "linear.weight", 2: None, 3: None}


def test_delegate_data_and_two_methods() -> None:
    data, report = report_of(control_flow_program())
    assert sum(row.nbytes for row in report.rows) == len(data)
    rows = rows_by_item(report)
    assert rows["inline delegate data 0 (ExampleBackend)"] == len(b"opaque payload")
    assert rows["constant 1: %1 of forward f32[2, 3] used by aten::add.out"] == 24
    methods = {r.detail.get("method") for r in report.rows if r.group == "program (FlatBuffer)"}
    assert {"forward", "choose"} <= methods
    assert rows["choose: instructions (6 instructions)"] > 0
    # The stack traces are in exirc's metadata segment (compressed, with the
    # names), a row of its own; files from before hold them in the FlatBuffer.
    assert rows["named data 'exirc.metadata'"] > 0
    older = serialize(control_flow_program(), metadata_segment=False)
    rows = rows_by_item(size_report(older))
    assert rows["forward: stack traces (1 frame)"] > len("model.py") + len("return x + self.w")


def test_a_program_using_every_table_sums_to_the_file_size() -> None:
    pytest.importorskip("torch")  # the module building it imports torch
    from tests.serialize.test_handbuilt_program import everything_program

    for data in (serialize(everything_program()),
                 serialize(everything_program(), metadata_segment=False)):
        report = size_report(data)
        assert sum(row.nbytes for row in report.rows) == len(data)
        kinds = {row.kind for row in report.rows}
        assert {"values", "instructions", "operators", "delegates", "constant",
                "delegate_data", "padding"} <= kinds
    assert "stacktrace" in kinds  # the older layout's stack traces, in the FlatBuffer


# --------------------------------------------------------------------------
# The command line.
# --------------------------------------------------------------------------


@pytest.fixture
def twin_pte(tmp_path: Path) -> Path:
    path = tmp_path / "twin.pte"
    path.write_bytes(serialize(twin_weights_program()))
    return path


def test_cli_size_text(capsys: pytest.CaptureFixture[str], twin_pte: Path) -> None:
    code, out, err = run(capsys, "inspect", str(twin_pte), "--show", "size")
    assert code == 0, err
    size = twin_pte.stat().st_size
    assert f"size of {twin_pte}: " in out
    total = next(line for line in out.splitlines() if line.strip().startswith("total"))
    assert size > 1024  # so the exact count is shown next to the human size
    assert total.split()[-1] == "100.0%" and f"({size:,} B)" in total
    assert "segment 0: constants" in out
    (second,) = [line for line in out.splitlines() if "constant 2: %2 f32[2, 3]" in line]
    assert second.endswith("duplicate of 1")
    assert "duplicate bytes: 24 B in 1 tensor: constant 1, constant 2 (24 B each); storing " \
           "each once would save 24 B\n" in out


def test_cli_size_json(capsys: pytest.CaptureFixture[str], twin_pte: Path) -> None:
    code, out, err = run(capsys, "inspect", str(twin_pte), "--show", "size", "--json")
    assert code == 0, err
    size = json.loads(out)["size"]
    # The buckets that were there before stay; the rows are added.
    assert size["total"] == twin_pte.stat().st_size
    assert sum(row["bytes"] for row in size["rows"]) == size["total"]
    assert size["duplicates"] == [{"buffers": [1, 2], "tensors": ["constant 1", "constant 2"],
                                   "count": 2, "bytes": 24, "saving": 24}]
    assert size["duplicate_bytes"] == 24
    assert size["duplicate_tensors"] == 1
    code, out, _ = run(capsys, "inspect", str(twin_pte), "--json")
    assert "rows" not in json.loads(out)["size"]  # only when asked for


def test_compiled_constants_are_named_by_parameter() -> None:
    import torch

    from exirc.compiler import compile_module

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 8)
            self.fc2 = torch.nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x))) * 0.5

    result = compile_module(Net().eval(), (torch.randn(3, 4),))
    items = " | ".join(rows_by_item(size_report(result.data)))
    # Biases as they are; weights transposed at compile time, named by what
    # they were folded from; the scalar by its value.
    for name in ("fc1.bias f32[8]", "fc2.bias f32[2]", "fc1.weight (permute_copy) f32[4, 8]",
                 "fc2.weight (permute_copy) f32[8, 2]", "the number 0.5 f32[]"):
        assert name in items, items


def test_a_malformed_names_segment_is_a_format_error() -> None:
    from exirc.errors import FormatError
    from exirc.serialize import constant_names

    program = twin_weights_program()
    program.add_named_segment(constant_names.NAMED_DATA_KEY, b'{"format_version": 1}')
    with pytest.raises(FormatError, match="constant names"):
        size_report(serialize(program))
