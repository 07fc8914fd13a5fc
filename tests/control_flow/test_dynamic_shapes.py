"""Dynamic shapes end to end: bounded symbols planned at their upper bounds,
outputs at their actual sizes, symbols shown by `inspect`, sizes outside the
range refused at compile time (no bound) and at run time (out of range)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest
import torch
from torch.export import Dim

from exirc.cli.app import main
from exirc.compiler import compile_module
from exirc.errors import ExircError
from exirc.serialize import program as P
from tests.control_flow.helpers import check_everywhere, compiled
from tests.control_flow.test_control_flow import MapRows, WhileCountdown


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).softmax(-1)


class Derived(torch.nn.Module):
    """y has twice x's rows (a derived dim); sizes feed reshapes."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        pairs = y.reshape(n, 2, 8).sum(1)
        return torch.cat([x, pairs], dim=1) * 2, y.reshape(-1)[: n * 3] + 1


class SelfAttention(torch.nn.Module):
    """One attention block; the sequence length is dynamic."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        self.norm = torch.nn.LayerNorm(16)
        self.feed_forward = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                                torch.nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, need_weights=False)
        x = self.norm(x + attended)
        return x + self.feed_forward(x)


class CondOnBatch(torch.nn.Module):
    """Control flow under a dynamic batch: the branch depends on the data."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x.flip(0), (x,))


BATCH = Dim("batch", min=1, max=64)
SEQUENCE = Dim("sequence", min=1, max=128)

MODELS = {
    "mlp": (Mlp, lambda: (torch.randn(4, 8),), lambda: ({0: BATCH},)),
    "derived": (Derived, lambda: (torch.randn(4, 8), torch.randn(8, 8)),
                lambda: ({0: BATCH}, {0: 2 * BATCH})),
    "attention": (SelfAttention, lambda: (torch.randn(2, 10, 16),),
                  lambda: ({1: SEQUENCE},)),
    "cond_on_batch": (CondOnBatch, lambda: (torch.randn(4, 3),), lambda: ({0: BATCH},)),
    # map over as many rows as the input has; a loop state of dynamic size
    "map_dynamic_rows": (MapRows, lambda: (torch.randn(6, 3), torch.randn(5)),
                 lambda: ({0: BATCH}, None)),
    "while_dynamic_state": (WhileCountdown, lambda: (torch.randn(2, 4), torch.tensor(3)),
                        lambda: ({0: BATCH}, None)),
}

SIZES = {
    "mlp": [lambda n: (torch.randn(n, 8),)],
    "derived": [lambda n: (torch.randn(n, 8), torch.randn(2 * n, 8))],
    "attention": [lambda n: (torch.randn(2, n, 16),)],
    "cond_on_batch": [lambda n: (torch.rand(n, 3),), lambda n: (-torch.rand(n, 3),)],
    "map_dynamic_rows": [lambda n: (torch.randn(n, 3), torch.randn(5))],
    "while_dynamic_state": [lambda n: (torch.randn(n, 4), torch.tensor(n % 5))],
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_size_matches_eager(name: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    model, result = compiled(name, *MODELS[name])
    biggest = 128 if name == "attention" else 64
    torch.manual_seed(2)
    cases = [make(n) for n in (1, biggest // 2 - 5, biggest) for make in SIZES[name]]
    check_everywhere(model, result, cases, tmp_path, capsys)


def test_dynamic_tensors_are_planned_at_their_bounds() -> None:
    _, result = compiled("derived", *MODELS["derived"])
    plan = result.program.execution_plan[0]
    x, y = (plan.values[i] for i in plan.inputs)
    assert isinstance(x, P.Tensor) and isinstance(y, P.Tensor)
    assert (x.sizes, y.sizes) == ([64, 8], [128, 8])
    assert x.shape_dynamism == y.shape_dynamism == P.TensorShapeDynamism.DYNAMIC_BOUND
    assert x.nbytes == 64 * 8 * 4
    operators = {op.qualified_name for op in plan.operators}
    assert "aten::sym_size.int" in operators  # n comes from x at run time
    assert any(name.startswith("executorch_prim::mul") for name in operators)  # n * 3


def test_inspect_names_dynamic_dims_by_their_dim_names(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "derived.pte"
    compiled("derived", *MODELS["derived"])[1].save(path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    inputs_line = next(line for line in out.splitlines() if line.strip().startswith("inputs:"))
    assert inputs_line.endswith(" f32[batch<=64, 8], y=%3 f32[2*batch<=128, 8]"), inputs_line
    assert main(["inspect", str(path), "--json"]) == 0
    method = json.loads(capsys.readouterr().out)["methods"][0]
    assert method["symbols"] == {"batch": {"min": 1, "max": 64}}
    assert [entry["dims"] for entry in method["inputs"]] == [["batch", 8], ["2*batch", 8]]
    assert main(["inspect", str(path), "--show", "instructions"]) == 0
    listing = capsys.readouterr().out
    assert "f32[batch<=64, 16] = aten::cat.out" in listing  # a result, by symbol


@pytest.mark.parametrize(("shapes", "message"), [
    ([(65, 8), (130, 8)], "x dim 0 is 65, but batch must be in 1..64"),
    ([(0, 8), (0, 8)], "x dim 0 is 0, but batch must be in 1..64"),
    ([(3, 8), (5, 8)], "y dim 0 is 5, but must be 2*batch = 6"),
])
def test_inputs_outside_the_range_are_refused_before_running(
        shapes: list[tuple[int, int]], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "derived.pte"
    compiled("derived", *MODELS["derived"])[1].save(path)
    inputs = tmp_path / "inputs.npz"
    numpy.savez(inputs, **{f"input_{i}": numpy.zeros(s, numpy.float32)
                           for i, s in enumerate(shapes)})
    out = tmp_path / "out.npz"
    code = main(["run", str(path), "--inputs", str(inputs), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "error[E0201]" in err and message in err, err
    assert not out.exists()


def test_a_dim_without_upper_bound_fails_the_compile_saying_how_to_bound_it() -> None:
    with pytest.raises(ExircError) as caught:
        compile_module(Mlp(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
    error = caught.value
    assert error.code == "E0311"
    assert "has no upper bound" in error.message
    assert 'Dim("' in error.message and "max=" in error.message
