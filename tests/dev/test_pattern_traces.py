"""The oracle tests' XNNPACKQuantizer traces each conv-bn pattern once
(`tests/pattern_traces.py`), and quantizes exactly as ExecuTorch's own does."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tests import pattern_traces
from tests.oracle import requires_executorch

pytestmark = [requires_executorch, pytest.mark.oracle,
              pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                 reason="needs torchao (ExecuTorch's quantization flow)")]


class ConvBnRelu(nn.Module):
    """Both conv dimensions the quantizer's conv-bn patterns match, and a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv2d, self.bn2d = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
        self.conv1d, self.bn1d = nn.Conv1d(4, 4, 1), nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn2d(self.conv2d(x))).flatten(2)
        return self.fc(self.bn1d(self.conv1d(y)).mean(-1))


@pytest.fixture
def executorchs_own_traces() -> Iterator[None]:
    """Each test starts from ExecuTorch's function, and leaves the memo as it was."""
    was_on = pattern_traces.traces_patterns_once()
    pattern_traces.undo()
    yield
    if was_on:
        pattern_traces.trace_patterns_once()
    else:
        pattern_traces.undo()


def _prepared(exports: list[int]) -> tuple[str, list[tuple[str, str]]]:
    """The model prepared for calibration (its code and its observers), counting
    the `torch.export.export` calls made meanwhile in `exports`."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    torch.manual_seed(0)
    model = ConvBnRelu().eval()
    inputs = (torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1)),)
    captured = torch.export.export(model, inputs).module()
    export = torch.export.export

    def counted(*args: object, **kwargs: object) -> torch.export.ExportedProgram:
        exports.append(1)
        return export(*args, **kwargs)  # type: ignore[arg-type]

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.export, "export", counted)
        prepared = prepare_pt2e(captured, quantizer)
    return prepared.code, [(name, repr(child)) for name, child in prepared.named_children()]


@pytest.mark.usefixtures("executorchs_own_traces")
def test_patterns_are_traced_once_and_prepare_the_same_model() -> None:
    own: list[int] = []
    theirs = _prepared(own)
    assert own, "ExecuTorch's quantizer traced no pattern: nothing here is saved"
    pattern_traces.trace_patterns_once()
    first: list[int] = []
    assert _prepared(first) == theirs
    again: list[int] = []
    assert _prepared(again) == theirs
    assert not again, f"{len(again)} patterns traced again"
    assert any("conv" in line and "activation_post_process" in line
               for line in theirs[0].splitlines())


@pytest.mark.usefixtures("executorchs_own_traces")
def test_installing_twice_wraps_once_and_undo_restores_executorchs_function() -> None:
    utils = importlib.import_module(
        "executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils")
    own = utils._get_aten_graph_module_for_pattern
    pattern_traces.trace_patterns_once()
    pattern_traces.trace_patterns_once()
    assert utils._get_aten_graph_module_for_pattern.__wrapped__ is own
    pattern_traces.undo()
    assert utils._get_aten_graph_module_for_pattern is own
