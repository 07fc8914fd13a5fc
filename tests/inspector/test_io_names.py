"""Method inputs and outputs keep the names users know (`input_ids`, `logits`):
stored beside the program (`serialize.io_names`) and shown by `inspect`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from exirc.compiler import compile_module
from exirc.emit.io_names import output_names
from exirc.errors import FormatError
from exirc.serialize import io_names
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.programs import add_constant_program


class Tagger(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        h = input_ids.float() * attention_mask
        return {"logits": h, "past": (h + 1, h + 2)}


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> object:
        return x + 1, x * 2


def inspect_json(capsys: pytest.CaptureFixture[str], path: Path) -> Any:
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    assert code == 0
    (method,) = json.loads(out)["methods"]
    return method


def test_inputs_and_outputs_are_named_in_inspect(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    path = tmp_path / "tagger.pte"
    compile_module(Tagger(), (torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3))).save(path)
    method = inspect_json(capsys, path)
    assert [e["name"] for e in method["inputs"]] == ["input_ids", "attention_mask"]
    assert [e["name"] for e in method["outputs"]] == ["logits", "past.0", "past.1"]
    code, out, _ = run(capsys, "inspect", str(path))
    assert code == 0
    assert "inputs:  input_ids=%" in out and ", attention_mask=%" in out
    assert "outputs: logits=%" in out and "past.1=%" in out


def test_positions_in_a_plain_tuple_keep_the_default_names(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "pair.pte"
    compile_module(Pair(), (torch.ones(2),)).save(path)
    method = inspect_json(capsys, path)
    assert [e["name"] for e in method["inputs"]] == ["x"]
    assert [e["name"] for e in method["outputs"]] == ["output_0", "output_1"]


def test_output_paths_of_nested_structures() -> None:
    tree = {"logits": 0, "cache": [(1, 2)]}
    _, spec = torch.utils._pytree.tree_flatten(tree)
    assert output_names(spec, 3) == ["logits", "cache.0.0", "cache.0.1"]
    assert output_names(spec, 4) is None  # not this method's outputs


@pytest.mark.parametrize("stored", [
    {"inputs": ["a", "a"], "outputs": ["o"]},  # not distinct
    {"inputs": ["../../etc/passwd"], "outputs": ["o"]},  # a path
    {"inputs": ["\x1b[31mred"], "outputs": ["o"]},  # a terminal escape
    {"inputs": ["a", "b", "c"], "outputs": ["o"]},  # the wrong count
])
def test_unusable_stored_names_fall_back_to_the_defaults(stored: dict[str, list[str]]) -> None:
    methods = {"forward": io_names.MethodNames(stored["inputs"], stored["outputs"])}
    names = io_names.method_names(methods, "forward", inputs=2, outputs=1)
    assert names.inputs == ["input_0", "input_1"]
    assert names.outputs == ["o"]


@pytest.mark.parametrize("segment", [b"{", b'{"format_version": 1, "methods": {"f": 3}}',
                                     b'{"format_version": 1, "methods": {"f": '
                                     b'{"inputs": [1], "outputs": []}}}'])
def test_a_malformed_names_segment_is_a_format_error(segment: bytes) -> None:
    with pytest.raises(FormatError, match="input and output names"):
        io_names.decode(segment)


def test_inspect_refuses_a_file_whose_names_segment_is_malformed(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    program = add_constant_program()  # hand-built: no names of its own
    program.add_named_segment(io_names.NAMED_DATA_KEY, b'{"format_version": 1, "methods": 7}')
    path = tmp_path / "bad.pte"
    path.write_bytes(serialize(program))
    code, _, err = run(capsys, "inspect", str(path), "--json")
    assert code == 3 and "E0300" in err and "input and output names" in err
