"""`exirc inspect` lists the kernel libraries a file needs and the delegates it calls,
in text and in --json, from the operators the file's methods name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from exirc.cli.app import main
from exirc.compiler import CompileOptions, compile_module
from exirc.serialize.reader import deserialize


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


def _inspect(capsys: pytest.CaptureFixture[str], path: Path, *flags: str) -> str:
    assert main(["inspect", str(path), *flags]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("target", "quantize"), [("portable", "int8"), ("xnnpack", "int8"),
                                                  ("xnnpack", None)])
def test_kernels_are_the_libraries_of_the_operators_the_file_names(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str,
        quantize: str | None) -> None:
    torch.manual_seed(0)
    result = compile_module(Mlp().eval(), (torch.randn(2, 16),),
                            options=CompileOptions(target=target, quantize=quantize))
    path = tmp_path / "m.pte"
    path.write_bytes(result.data)
    program = deserialize(result.data)
    names = {op.qualified_name for plan in program.execution_plan for op in plan.operators}
    delegates = sorted({d.id for plan in program.execution_plan for d in plan.delegates})

    kernels = json.loads(_inspect(capsys, path, "--json"))["kernels"]
    assert kernels["delegates"] == delegates
    listed = {op for library in kernels["libraries"] for op in library["operators"]}
    assert listed == names
    for library in kernels["libraries"]:
        expected = {"aten": "portable", "quantized_decomposed": "quantized"}[library["namespace"]]
        assert library["name"] == expected
        assert all(op.startswith(library["namespace"] + "::") for op in library["operators"])

    line = next(x for x in _inspect(capsys, path).splitlines() if x.startswith("kernels: "))
    if not names:
        assert line.startswith("kernels: none outside the delegates; delegates: XnnpackBackend")
    for library in kernels["libraries"]:
        assert f"{library['name']} ({library['operators'][0]}" in line
    if quantize == "int8" and target == "portable":
        assert "quantized (quantized_decomposed::" in line
