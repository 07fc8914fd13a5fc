"""Compile a model once, then check it against eager PyTorch on many inputs:
through `exirc run` (the command line), and through ExecuTorch's runtime."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from exirc.cli.app import main
from exirc.compiler import CompileResult, compile_module
from tests.oracle import run_with_executorch

Inputs = tuple[torch.Tensor, ...]


def eager_outputs(model: torch.nn.Module, inputs: Inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        result = model(*[t.clone() for t in inputs])
    return list(result) if isinstance(result, (tuple, list)) else [result]


def assert_matches(actual: Sequence[Any], expected: Sequence[torch.Tensor], what: str) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(actual, expected)):
        got = torch.as_tensor(numpy.asarray(got)) if not isinstance(got, torch.Tensor) else got
        assert got.shape == want.shape, f"{what}, output {i}: shape {list(got.shape)} " \
                                        f"!= {list(want.shape)}"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"{what}, output {i}")


def run_cli(path: Path, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str],
            ) -> list[numpy.ndarray]:
    """`exirc run PATH --inputs in.npz -o out.npz`; the outputs it wrote."""
    arrays = tmp_path / "inputs.npz"
    numpy.savez(arrays, **{f"input_{i}": t.numpy() for i, t in enumerate(inputs)})
    out = tmp_path / "outputs.npz"
    out.unlink(missing_ok=True)
    code = main(["run", str(path), "--inputs", str(arrays), "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    with numpy.load(out) as saved:
        return [saved[f"output_{i}"] for i in range(len(saved.files))]


@functools.cache
def _compiled(key: str, build: Callable[[], torch.nn.Module], example: Callable[[], Inputs],
              dynamic_shapes: Callable[[], Any] | None) -> tuple[torch.nn.Module, CompileResult]:
    torch.manual_seed(0)
    model = build().eval()
    result = compile_module(model, example(),
                            dynamic_shapes=dynamic_shapes() if dynamic_shapes else None)
    return model, result


def compiled(key: str, build: Callable[[], torch.nn.Module], example: Callable[[], Inputs],
             dynamic_shapes: Callable[[], Any] | None = None,
             ) -> tuple[torch.nn.Module, CompileResult]:
    """The model (seeded) and its compiled program, cached per `key` for the session."""
    return _compiled(key, build, example, dynamic_shapes)


def check_everywhere(model: torch.nn.Module, result: CompileResult, cases: Sequence[Inputs],
                     tmp_path: Path, capsys: pytest.CaptureFixture[str], *,
                     executorch: bool = True) -> None:
    """Every case matches eager through `exirc run` and (if asked) ExecuTorch's runtime."""
    path = tmp_path / "model.pte"
    result.save(path)
    for n, inputs in enumerate(cases):
        expected = eager_outputs(model, inputs)
        assert_matches(run_cli(path, inputs, tmp_path, capsys), expected,
                       f"case {n}, exirc run")
        if executorch:
            assert_matches(run_with_executorch(result.data, inputs), expected,
                           f"case {n}, ExecuTorch")
