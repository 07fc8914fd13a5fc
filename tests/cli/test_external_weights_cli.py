"""`exirc compile --external-weights`, `exirc run --data`, `exirc inspect --data`: the CLI
over one implementation (exirc.compile's), each command's promise checked as a user sees it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest
import torch

from exirc.cli.app import main
from tests.compile.test_cli_compile import MLP, eager, write


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_compile_run_and_inspect_with_a_data_file(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = write(tmp_path, "model.py", MLP)
    code, _, err = _main(capsys, "compile", str(model), "--target", "xnnpack", "-o", "m.pte",
                         "--external-weights", "m.ptd")
    assert code == 0, err
    assert "weights in m.ptd (" in err and "run with --data" in err
    expected, inputs = eager(model)
    numpy.save(tmp_path / "x.npy", inputs[0].numpy())
    code, _, err = _main(capsys, "run", "m.pte", "--data", "m.ptd", "--inputs", "x.npy",
                         "-o", "out.npz")
    assert code == 0, err
    got = torch.from_numpy(numpy.load(tmp_path / "out.npz")["output_0"])
    torch.testing.assert_close(got, expected[0], rtol=1e-4, atol=1e-5)

    code, _, err = _main(capsys, "run", "m.pte", "--random")
    assert code == 2
    assert "error[E0205]: delegate 0 of method 'forward' reads named data (" in err
    assert "--data FILE.ptd" in err

    code, out, _ = _main(capsys, "inspect", "m.pte")
    assert code == 0
    assert "external data: 4 delegate weights in a data file; run with --data FILE.ptd" in out
    code, out, _ = _main(capsys, "inspect", "m.pte", "--data", "m.ptd")
    assert code == 0
    assert "external data: 4 delegate weights in m.ptd (4 entries, all found)" in out
    code, out, _ = _main(capsys, "inspect", "m.pte", "--data", "m.ptd", "--json")
    facts = json.loads(out)["external_data"]
    assert facts["delegate_keys"] == 4 and facts["tensors"] == 0
    assert facts["data_file"] == {"path": "m.ptd", "size": (tmp_path / "m.ptd").stat().st_size,
                                  "entries": 4}


def test_compile_json_reports_the_data_file(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = write(tmp_path, "model.py", MLP)
    data = tmp_path / "w.ptd"
    code, out, _ = _main(capsys, "compile", str(model), "-o", str(tmp_path / "m.pte"),
                         "--external-weights", str(data), "--json")
    assert code == 0
    assert json.loads(out)["external_data"] == {"path": str(data),
                                                "size": data.stat().st_size}


@pytest.mark.parametrize(("options", "message"), [
    (["--external-weights", "m.pte"], "--external-weights m.pte is the program's own path"),
    (["--external-weights", "m.ptd", "--max-arena", "16"], "error[E0312]"),
])
def test_a_refused_compile_writes_neither_file(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               options: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", MLP)
    code, _, err = _main(capsys, "compile", "model.py", "-o", "m.pte", *options)
    assert code != 0 and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]
