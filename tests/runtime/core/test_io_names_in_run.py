"""`run` and the runtime use the names a program keeps for its inputs and
outputs: `.npz` keys, messages and mappings by name (`exirc.runtime.core.io_names`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest
import torch

from exirc.compiler import compile_module
from exirc.errors import InputError
from exirc.runtime import load
from tests.cli.test_conventions import run
from tests.inspector.test_io_names import Tagger


@pytest.fixture(scope="module")
def tagger_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("names") / "tagger.pte"
    compile_module(Tagger(), (torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3))).save(path)
    return path


def test_loaded_methods_carry_the_stored_names(tagger_file: Path) -> None:
    method = load(tagger_file).method("forward")
    assert [spec.name for spec in method.inputs] == ["input_ids", "attention_mask"]
    assert method.output_names == ["logits", "past.0", "past.1"]
    assert "input_ids: i64[1, 3]" in method.signature()


def test_inputs_by_stored_name(tagger_file: Path) -> None:
    program = load(tagger_file)
    ids, mask = torch.tensor([[1, 2, 3]]), torch.tensor([[1.0, 0.0, 1.0]])
    (logits, _, _) = program.run("forward", {"attention_mask": mask, "input_ids": ids})
    torch.testing.assert_close(logits, ids.float() * mask)
    with pytest.raises(InputError, match="input_ids"):
        program.run("forward", {"input_0": ids, "input_1": mask})


def test_messages_name_the_input(tagger_file: Path) -> None:
    with pytest.raises(InputError, match=r"^attention_mask has shape \[2, 3\]"):
        load(tagger_file).run("forward", [torch.ones(1, 3, dtype=torch.long), torch.ones(2, 3)])


def test_npz_keys_are_the_stored_names_or_the_positions(
        capsys: pytest.CaptureFixture[str], tagger_file: Path, tmp_path: Path) -> None:
    ids, mask = numpy.array([[1, 2, 3]]), numpy.array([[1.0, 0.0, 1.0]], dtype=numpy.float32)
    by_name, by_position = tmp_path / "named.npz", tmp_path / "positional.npz"
    numpy.savez(by_name, attention_mask=mask, input_ids=ids)
    numpy.savez(by_position, input_0=ids, input_1=mask)
    for path in (by_name, by_position):
        code, out, err = run(capsys, "run", str(tagger_file), "--inputs", str(path))
        assert code == 0, err
        assert "[1, 0, 3]" in out
    wrong = tmp_path / "wrong.npz"
    numpy.savez(wrong, ids=ids, mask=mask)
    code, _, err = run(capsys, "run", str(tagger_file), "--inputs", str(wrong))
    assert code == 2, err  # an InputError is a usage error
    assert "E0201" in err
    assert "has the keys ids, mask, but method 'forward' takes input_ids, attention_mask" in err
    assert "numpy.savez(path, input_ids=..., attention_mask=...)" in err


def test_outputs_are_written_and_shown_by_name(capsys: pytest.CaptureFixture[str],
                                               tagger_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.npz"
    code, text, err = run(capsys, "run", str(tagger_file), "--random", "-o", str(out))
    assert code == 0, err
    assert "  logits: f32[1, 3]" in text and "  past.1: f32[1, 3]" in text
    with numpy.load(out) as saved:
        assert list(saved.keys()) == ["logits", "past.0", "past.1"]
        numpy.testing.assert_allclose(saved["past.1"], saved["logits"] + 2)
    code, text, err = run(capsys, "run", str(tagger_file), "--random", "--json")
    assert code == 0, err
    assert [o["name"] for o in json.loads(text)["outputs"]] == ["logits", "past.0", "past.1"]
