"""fold_batch_norm: inference batch norms fold into the convolution before
them, and only where that cannot change what the program computes or keeps."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import ExportedProgram

from exirc.compiler import CompileOptions, compile_module
from exirc.edge.dead_code_elimination import DeadCodeElimination
from exirc.edge.fold_batch_norm import FoldBatchNorm
from exirc.edge.to_edge import ToEdge
from exirc.edge.verify import verify_edge
from exirc.runtime import load
from tests.edge.test_passes import assert_signature_in_step, targets
from tests.oracle import requires_executorch, run_with_executorch

aten = torch.ops.aten
BATCH_NORM = aten._native_batch_norm_legit_no_training.default


def _with_statistics(module: nn.Module) -> nn.Module:
    """Running statistics and affine parameters far from the defaults, so a
    wrong fold shows in the outputs."""
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2.0)
            if m.affine:
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)
    return module


def edge(module: nn.Module, *inputs: Any) -> ExportedProgram:
    program = torch.export.export(module, inputs, strict=False)
    return ToEdge().run(program).program


def fold(program: ExportedProgram, *, edge_dialect: bool = True) -> bool:
    changed = FoldBatchNorm().run(program).changed
    DeadCodeElimination().run(program)
    if edge_dialect:
        verify_edge(program)
    assert_signature_in_step(program)
    return changed


def assert_matches_eager(program: ExportedProgram, module: nn.Module, *inputs: Any) -> None:
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*inputs), module(*inputs),
                                   rtol=1e-5, atol=1e-5)


class ConvBatchNorm(nn.Module):
    def __init__(self, conv: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.conv, self.norm = conv, norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


CONVOLUTIONS = {
    "3x3": (lambda: nn.Conv2d(4, 6, 3, padding=1), (2, 4, 8, 8)),
    "no_bias_strided": (lambda: nn.Conv2d(4, 6, 3, stride=2, bias=False), (1, 4, 9, 9)),
    "depthwise": (lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False), (1, 6, 5, 5)),
    "grouped_dilated": (lambda: nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2),
                        (1, 4, 7, 7)),
    "1d": (lambda: nn.Conv1d(3, 5, 5, padding=2), (2, 3, 16)),
}


@pytest.mark.parametrize("name", sorted(CONVOLUTIONS))
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_folds_into_the_convolution(name: str, affine: bool) -> None:
    make_conv, shape = CONVOLUTIONS[name]
    conv = make_conv()
    norm = (nn.BatchNorm1d if len(shape) == 3 else nn.BatchNorm2d)(conv.out_channels,
                                                                   affine=affine)
    module = _with_statistics(ConvBatchNorm(conv, norm)).eval()
    x = torch.randn(shape)
    program = edge(module, x)
    assert fold(program)
    assert BATCH_NORM not in targets(program)
    assert targets(program).count(aten.convolution.default) == 1
    assert_matches_eager(program, module, x)


def test_the_old_weights_and_statistics_are_dropped() -> None:
    module = _with_statistics(ConvBatchNorm(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))).eval()
    program = edge(module, torch.randn(1, 3, 6, 6))
    fold(program)
    kept = {spec.target for spec in program.graph_signature.input_specs if spec.target}
    assert not kept & {"conv.weight", "norm.running_mean", "norm.running_var", "norm.weight"}


class SharedConvolution(nn.Module):
    """The convolution's raw output is returned too: folding would change it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return self.norm(y), y


class StatisticsFromInputs(nn.Module):
    """Running statistics the caller passes: not constants of the program."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.conv(x), mean, var, training=False)


class StatisticsUpdated(nn.Module):
    """The program updates a running statistic: state, changing from call to call."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.norm.running_mean.add_(1.0)
        return self.norm(self.conv(x))


class TransposedConvolution(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.ConvTranspose2d(3, 4, 3), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


X = torch.randn(1, 3, 6, 6)
UNFOLDABLE = {
    "shared_convolution": (SharedConvolution, (X,)),
    "statistics_from_inputs": (StatisticsFromInputs, (X, torch.randn(4), torch.rand(4) + 0.5)),
    "statistics_updated": (StatisticsUpdated, (X,)),
    "transposed": (TransposedConvolution, (X,)),
}


@pytest.mark.parametrize("name", sorted(UNFOLDABLE))
def test_batch_norm_stays_where_folding_would_change_the_program(name: str) -> None:
    make, inputs = UNFOLDABLE[name]
    module = _with_statistics(make()).eval()
    program = edge(module, *inputs)
    assert BATCH_NORM in targets(program)
    assert not fold(program)
    assert BATCH_NORM in targets(program)


def test_training_mode_batch_norm_is_not_folded() -> None:
    module = _with_statistics(ConvBatchNorm(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))).train()
    program = edge(module, X)
    before = targets(program)
    # Training batch norm is no Edge op (exirc refuses it later); the fold leaves it.
    assert not fold(program, edge_dialect=False)
    assert targets(program) == before


def test_the_exirc_target_folds_and_runs_like_eager() -> None:
    module = _with_statistics(ConvBatchNorm(nn.Conv2d(3, 8, 3, padding=1),
                                            nn.BatchNorm2d(8))).eval()
    x = torch.randn(2, 3, 8, 8)
    result = compile_module(module, (x,), options=CompileOptions(target="exirc", verify=True))
    program = load(result.data)
    operators = {op.name for plan in program.program.execution_plan for op in plan.operators}
    assert "aten::_native_batch_norm_legit_no_training" not in operators
    (got,) = program.run("forward", [x])
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)


@requires_executorch
def test_a_folded_portable_program_runs_on_executorch() -> None:
    module = _with_statistics(ConvBatchNorm(nn.Conv2d(3, 8, 3, padding=1, groups=1),
                                            nn.BatchNorm2d(8))).eval()
    x = torch.randn(1, 3, 8, 8)
    data = compile_module(module, (x,), options=CompileOptions(target="portable")).data
    assert b"_native_batch_norm_legit_no_training" not in bytes(data)
    (got,) = run_with_executorch(data, [x])
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)
