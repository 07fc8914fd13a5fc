"""The Python API (`exirc.compile`, `exirc.load`, `exirc.compile_methods`):
the CLI's functions, with the CLI's results and errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import exirc
from exirc.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)) * y + 1.0


def _model_and_inputs() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return SmallNet().eval(), (torch.randn(4, 6), torch.randn(4, 3))


def test_compile_a_module_then_load_and_run_it_like_eager(tmp_path: Path) -> None:
    model, inputs = _model_and_inputs()
    output = tmp_path / "small.pte"
    result = exirc.compile(model, inputs, output, target="portable", verify=True)
    assert output.read_bytes() == result.data
    assert result.verification is not None  # verify= is the CLI's --verify
    fresh = (torch.randn(4, 6), torch.randn(4, 3))
    for source in (output, str(output), result.data):  # a path, or the bytes
        (got,) = exirc.load(source).run("forward", list(fresh))
        torch.testing.assert_close(got, model(*fresh))


def test_compile_methods_takes_an_exported_program(tmp_path: Path) -> None:
    model, inputs = _model_and_inputs()
    exported = torch.export.export(model, inputs)
    result = exirc.compile_methods({"forward": exported},
                                   exirc.CompileOptions(target="xnnpack"))
    result.save(tmp_path / "exported.pte")
    (got,) = exirc.load(tmp_path / "exported.pte").run("forward", list(inputs))
    torch.testing.assert_close(got, model(*inputs))


def test_a_model_file_compiles_to_the_bytes_the_cli_writes(tmp_path: Path) -> None:
    from_api = exirc.compile(REPO / "examples" / "mlp.py", output=tmp_path / "api.pte")
    cli = subprocess.run([sys.executable, "-m", "exirc", "compile", str(REPO / "examples/mlp.py"),
                          "-q", "-o", str(tmp_path / "cli.pte")],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert (tmp_path / "cli.pte").read_bytes() == from_api.data


def test_unknown_option_is_a_usage_error_naming_the_options() -> None:
    model, inputs = _model_and_inputs()
    with pytest.raises(UsageError) as raised:
        exirc.compile(model, inputs, verfy=True)
    assert raised.value.code == "E0200" and raised.value.exit_code == 2
    assert "unknown compile option: verfy" in str(raised.value)
    assert raised.value.hint is not None and "verify" in raised.value.hint


def test_a_module_without_example_inputs_is_a_usage_error() -> None:
    model, _ = _model_and_inputs()
    with pytest.raises(UsageError, match="an nn.Module needs example_inputs"):
        exirc.compile(model)


def test_an_exported_program_is_pointed_to_compile_methods() -> None:
    model, inputs = _model_and_inputs()
    with pytest.raises(UsageError) as raised:
        exirc.compile(torch.export.export(model, inputs), inputs)
    assert "got ExportedProgram" in str(raised.value)
    assert raised.value.hint is not None and "compile_methods" in raised.value.hint


def test_an_unwritable_output_fails_before_compiling(tmp_path: Path) -> None:
    model, inputs = _model_and_inputs()
    with pytest.raises(UsageError, match="cannot write the program .*: directory .* does not"):
        exirc.compile(model, inputs, tmp_path / "absent" / "x.pte")


def test_import_exirc_and_its_api_names_stay_torch_free() -> None:
    probe = ("import sys, exirc\n"
             "assert callable(exirc.compile) and callable(exirc.load)\n"
             "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
