"""`exirc inspect`: golden text views, the JSON shape, and its figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.programs import add_constant_program, control_flow_program

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden"
# Regenerating golden files is deliberate: EXIRC_UPDATE_GOLDEN=1 pytest ...
UPDATE = os.environ.get("EXIRC_UPDATE_GOLDEN") == "1"


@pytest.fixture
def add_pte(tmp_path: Path) -> Path:
    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


@pytest.fixture
def control_pte(tmp_path: Path) -> Path:
    path = tmp_path / "control.pte"
    path.write_bytes(serialize(control_flow_program()))
    return path


def check_golden(name: str, text: str, path: Path) -> None:
    text = text.replace(str(path), "<file>")
    golden = GOLDEN / name
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text(), f"{name} changed; rerun with EXIRC_UPDATE_GOLDEN=1 if meant"


@pytest.mark.smoke
def test_summary_golden(capsys: pytest.CaptureFixture[str], add_pte: Path) -> None:
    code, out, err = run(capsys, "inspect", str(add_pte))
    assert code == 0, err
    check_golden("add_summary.txt", out, add_pte)


def test_instructions_golden(capsys: pytest.CaptureFixture[str], control_pte: Path) -> None:
    code, out, err = run(capsys, "inspect", str(control_pte), "--show", "instructions")
    assert code == 0, err
    check_golden("control_instructions.txt", out, control_pte)


def test_summary_figures(capsys: pytest.CaptureFixture[str], add_pte: Path) -> None:
    code, out, _ = run(capsys, "inspect", str(add_pte), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["format"] == "exirc.inspect" and info["format_version"] == 1
    assert info["quantization"] == {"count": 0, "tensors": []}  # added within version 1
    (method,) = info["methods"]
    # A hand-built file stores no names: the defaults (added within version 1).
    assert method["inputs"] == [{"name": "input_0", "value": 0, "kind": "Tensor",
                                 "type": "f32[2, 3]",
                                 "dtype": "f32", "shape": [2, 3], "dynamism": "static",
                                 "bytes": 24}]
    assert [o["calls"] for o in method["operators"]] == [1]
    assert method["memory_plan"]["buffers"] == [{"id": 1, "bytes": 64}]
    assert method["memory_plan"]["planned_tensors"] == 2
    # One 6-float constant; the segment holds it at offset 0 (buffer 0 is empty).
    assert info["constants"] == {"count": 1, "bytes": 24, "buffers": 1}
    size = info["size"]
    assert size["constants"] == 24
    assert size["total"] == add_pte.stat().st_size
    parts = ("program", "constants", "delegate_data", "other_segments", "padding")
    assert sum(size[k] for k in parts) == size["total"]
    header = info["file"]["header"]
    assert header["segment_base_offset"] % 128 == 0
    assert header["segment_base_offset"] >= header["program_size"] == size["program"]
    assert method["instructions"][0]["source"] == {
        "file": "model.py", "line": 12, "function": "forward", "code": "return x + self.w"}


def test_json_lists_every_instruction_kind(capsys: pytest.CaptureFixture[str],
                                           control_pte: Path) -> None:
    code, out, _ = run(capsys, "inspect", str(control_pte), "--json", "--method", "choose")
    assert code == 0
    (method,) = json.loads(out)["methods"]
    kinds = [i["kind"] for i in method["instructions"]]
    assert kinds == ["JumpFalseCall", "KernelCall", "JumpFalseCall", "MoveCall",
                     "DelegateCall", "FreeCall"]
    assert method["instructions"][0]["destination_instruction"] == 3
    assert method["delegates"] == [{"index": 0, "id": "ExampleBackend", "location": "inline",
                                    "data_index": 0, "bytes": len(b"opaque payload"),
                                    "compile_specs": ["level"]}]


def test_unknown_method_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                         add_pte: Path) -> None:
    code, _, err = run(capsys, "inspect", str(add_pte), "--method", "nope")
    assert code == 2
    assert "no method named 'nope'" in err and "forward" in err


class Counter(torch.nn.Module):
    """Constants of odd sizes (stored aligned, with padding between them) and a
    large buffer the model updates (program state, not a constant)."""

    seen: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 5)  # 60 + 20 bytes
        self.register_buffer("seen", torch.zeros(64, 64))  # 16 KiB of state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(1.0)
        return self.linear(x) + self.seen[0, :5]


def test_constants_are_one_figure_in_the_summary_the_segment_and_the_size_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Which bytes: the constants as stored, the padding that aligns each buffer
    # included (the segment line's and the size line's figure, and the compile
    # summary's). The summary line once counted the state's initial value (16 KiB,
    # in a mutable data segment, under buffer numbers of its own) as constants:
    # "16.1 KiB" where the segment and size lines said 108 B. Without the padding
    # it would have said 84 B (60 + 20 + 4 bytes of tensors).
    from exirc.compiler import compile_module

    result = compile_module(Counter().eval(), (torch.randn(2, 3),))
    path = tmp_path / "counter.pte"
    result.save(path)
    code, out, _ = run(capsys, "inspect", str(path), "--show", "summary")
    assert code == 0
    lines = out.splitlines()
    (segment,) = [line for line in lines if line.startswith("  segment 0:")]
    assert segment.startswith("  segment 0: 108 B at offset ") and segment.endswith(
        " (constants)")
    assert "constants: 3 tensors, 108 B" in lines
    (size,) = [line for line in lines if line.startswith("size: ")]
    assert " | constants 108 B (1%) | other segments 16.1 KiB (87%)" in size
    assert "  state: 1 tensor, 16.0 KiB, kept from run to run" in lines
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    info = json.loads(out)
    assert info["constants"] == {"count": 3, "bytes": 108, "buffers": 3}
    assert info["size"]["constants"] == 108 == result.report.constant_bytes
