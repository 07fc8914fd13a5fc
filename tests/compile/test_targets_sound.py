"""Every target is sound: regressions of `--target exirc` giving wrong answers.

The fused `exirc::addmm_relu` writes into its `out=` memory, but the
planner's lifetimes did not follow the fused op's result to that memory, so
it ended when the op ran: the next linear's output was planned over the
hidden activations it was still reading. A `slice -> linear -> relu ->
linear` head and an MLP ending in softmax (a fine-tuned classifier's head)
were wrong while `inspect --show memory` warned of the overlap. Each model
here is compiled for every built-in target and run by the real runtimes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from exirc.cli.app import main
from exirc.compiler import CompileOptions, CompileResult, compile_module
from tests.oracle import requires_executorch, run_with_executorch
from tests.targets import PORTABLE, TARGETS


class SlicedHead(nn.Module):
    """The issue's reproducer: a slice feeding linear -> relu -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, 1:9]
        return self.b(torch.relu(self.a(x)))


class SoftmaxMLP(nn.Module):
    """A classifier head: two linear + relu layers, a linear, then softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        return torch.softmax(self.c(h), dim=-1)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "sliced_head": (SlicedHead, lambda: torch.randn(2, 10)),
    "softmax_mlp": (SoftmaxMLP, lambda: torch.randn(3, 8)),
}


def _build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    """The model (seeded), its example inputs and its eager output."""
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model, x = build().eval(), inputs()
    with torch.no_grad():
        return model, (x,), model(x)


def _compile(name: str, target: str) -> tuple[CompileResult, tuple[torch.Tensor, ...],
                                              torch.Tensor]:
    model, inputs, expected = _build(name)
    result = compile_module(model, inputs, options=CompileOptions(target=target))
    return result, inputs, expected


def _operators(result: CompileResult) -> set[str]:
    return {op.name for plan in result.program.execution_plan for op in plan.operators}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_runs_like_eager_on_exircs_runtime(name: str, target: str) -> None:
    from exirc.runtime import load

    result, inputs, expected = _compile(name, target)
    if target == "exirc":  # the fusion whose memory the planner lost
        assert "exirc::addmm_relu" in _operators(result)
    (got,) = load(result.data).run("forward", list(inputs))
    torch.testing.assert_close(torch.as_tensor(got), expected, rtol=1e-4, atol=1e-5)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("name", MODELS)
def test_portable_runs_like_eager_on_executorch(name: str) -> None:
    result, inputs, expected = _compile(name, PORTABLE)
    (got,) = run_with_executorch(result.data, inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


HEAD = """\
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16); self.b = torch.nn.Linear(16, 4)
    def forward(self, x):
        x = x[:, 1:9]
        return self.b(torch.relu(self.a(x)))
model = M().eval()
example_inputs = (torch.randn(2, 10),)
"""


@pytest.mark.parametrize("target", TARGETS)
def test_the_issues_head_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  target: str) -> None:
    (tmp_path / "head.py").write_text(HEAD)
    pte = tmp_path / "head.pte"
    code = main(["compile", str(tmp_path / "head.py"), "--target", target, "-o", str(pte),
                 "--verify"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "verified: 1 output matches eager PyTorch" in out + err  # the summary: stderr
    assert pte.exists()
