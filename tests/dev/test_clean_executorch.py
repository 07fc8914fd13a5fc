"""The tests' ExecuTorch without its quantized kernels (tests/executorch_without_quantized.py)
is an oracle only if it refuses what a runtime without those kernels refuses, and
if one test's crash cannot pass for, or spoil, another's answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from tests import executorch_without_quantized as clean
from tests.oracle import requires_executorch

pytestmark = [requires_executorch, pytest.mark.oracle]


def _program(quantize: str | None) -> bytes:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    options = CompileOptions(quantize=quantize, min_sqnr_db=0.0) if quantize else CompileOptions()
    return compile_module(model, (torch.randn(2, 8),), options=options,
                          warn=lambda message: None).data


def test_a_file_that_calls_the_quantized_kernels_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="quantized_decomposed"):
        clean.run_executorch_without_quantized_kernels(_program("int8"), [torch.randn(2, 8)],
                                                       tmp_path)


def test_the_worker_answers_again_after_a_refusal_and_after_dying(tmp_path: Path) -> None:
    data, inputs = _program(None), [torch.randn(2, 8)]
    with pytest.raises(AssertionError):
        clean.run_executorch_without_quantized_kernels(b"not a program", inputs, tmp_path)
    first, = clean.run_executorch_without_quantized_kernels(data, inputs, tmp_path)
    process = clean._WORKER.process
    assert process is not None
    process.kill()
    process.wait(timeout=60)
    again, = clean.run_executorch_without_quantized_kernels(data, inputs, tmp_path)
    assert clean._WORKER.process is not process
    assert torch.equal(first, again)
