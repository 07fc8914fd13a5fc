"""`exirc inspect`: golden text views, the JSON shape, and its figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
