"""linear_weights: matmuls by a constant weight's transpose read the weight as
stored (`aten::linear.out`), so no transposed copy runs and a tied weight is
stored once; the kernel's arguments from a file are checked at load."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exirc.backend.linear_weights import LinearWeights
from exirc.backend.ops import linear
from exirc.backend.verify import verify_backend
from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.edge.constant_fold import ConstantFold
from exirc.edge.dead_code_elimination import DeadCodeElimination
from exirc.edge.to_edge import ToEdge
from exirc.edge.views_to_copies import ViewsToCopies
from exirc.errors import FormatError
from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from exirc.targets import pipeline_text
from tests import warm_exirc
from tests.oracle import requires_executorch, run_with_executorch
from tests.runtime.core.test_interpreter import build, planned

aten = torch.ops.aten
VOCAB, HIDDEN = 96, 16


class TiedLM(nn.Module):
    """A token embedding whose weight the output head reads too (GPT-2's tie)."""

    def __init__(self, head_bias: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.hidden = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=head_bias)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(ids))))


class WeightReadTwice(nn.Module):
    """A weight that a linear reads and a matmul reads as it is stored (an
    encoder and its tied decoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(12, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) @ self.weight


def _model(name: str) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 5))
    models: dict[str, tuple[nn.Module, tuple[Any, ...]]] = {
        "2d_bias": (nn.Linear(8, 12), (torch.randn(4, 8),)),
        "2d_no_bias": (nn.Linear(8, 12, bias=False), (torch.randn(4, 8),)),
        "3d_bias": (nn.Linear(8, 12), (torch.randn(2, 3, 8),)),
        "3d_no_bias": (nn.Linear(8, 12, bias=False), (torch.randn(2, 3, 8),)),
        "tied": (TiedLM(), (ids,)),
        "tied_with_bias": (TiedLM(head_bias=True), (ids,)),
        "read_twice": (WeightReadTwice(), (torch.randn(2, 3, 8),)),
    }
    module, inputs = models[name]
    return module.eval(), inputs


def _compile(module: nn.Module, inputs: tuple[Any, ...], tmp_path: Path, *,
             fold: bool, target: str = "exirc") -> CompileResult:
    """Compile for `target`; with fold=False constant folding folds nothing,
    as for weights over its max_bytes (a large lm_head)."""
    text = pipeline_text(target)
    if not fold:
        text = text.replace("max_bytes: 16777216", "max_bytes: 0")
        assert "max_bytes: 0" in text
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return compile_module(module, inputs, options=CompileOptions(target=target, pipeline=path))


def _operators(result: CompileResult) -> list[str]:
    return [op.name for op in result.program.method("forward").operators]


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "large"])
@pytest.mark.parametrize("name", ["2d_bias", "2d_no_bias", "3d_bias", "3d_no_bias", "tied",
                                  "tied_with_bias", "read_twice"])
def test_outputs_match_eager(name: str, fold: bool, tmp_path: Path) -> None:
    module, inputs = _model(name)
    result = _compile(module, inputs, tmp_path, fold=fold)
    (got,) = load(result.data).run("forward", list(inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, module(*inputs), rtol=1e-5, atol=1e-5)
    operators = _operators(result)
    assert "aten::permute_copy" not in operators
    # A weight nothing else reads stays folded (contiguous, as GEMM reads fastest);
    # one read elsewhere too, or not folded, is read as stored.
    expect_linear = not fold or name in ("tied", "tied_with_bias", "read_twice")
    assert ("aten::linear" in operators) == expect_linear


def _edge(module: nn.Module, inputs: tuple[Any, ...], max_bytes: int) -> Any:
    program = torch.export.export(module, inputs, strict=False)
    for step in (ToEdge(), ViewsToCopies(), ConstantFold(max_bytes=max_bytes),
                 DeadCodeElimination()):
        program = step.run(program).program
    return program


def _calls(program: Any) -> list[Any]:
    return [n.target for n in program.graph_module.graph.nodes if n.op == "call_function"]


def test_a_tied_weight_is_stored_once() -> None:
    module, inputs = _model("tied")
    program = _edge(module, inputs, max_bytes=1 << 24)

    def head_copies() -> int:
        return sum(tuple(t.shape) == (HIDDEN, VOCAB) for t in program.constants.values())

    assert head_copies() == 1  # constant folding's transposed copy of the embedding
    assert LinearWeights().run(program).changed
    verify_backend(program)
    assert _calls(program).count(linear) == 1
    assert head_copies() == 0  # gone, with its spec
    stored = {**program.state_dict, **program.constants}
    assert sum(t.numel() for t in stored.values()) == \
        sum(p.numel() for p in module.parameters())  # each unique parameter once
    torch.testing.assert_close(program.module()(*inputs), module(*inputs).detach())


def test_file_size_of_a_tied_head_does_not_double(tmp_path: Path) -> None:
    module, inputs = _model("tied")
    unique = sum(p.numel() * p.element_size() for p in module.parameters())
    for fold in (True, False):
        result = _compile(module, inputs, tmp_path, fold=fold)
        # Constants beyond the parameters: only alignment padding and a few scalars.
        assert unique <= result.report.constant_bytes < unique + 1024


def test_an_unscaled_addmm_only_and_a_bias_per_feature() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(6, 4))
            self.bias = nn.Parameter(torch.randn(3, 6))  # a bias per row: not linear's

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (torch.addmm(self.bias[0], x, self.weight.t(), beta=0.5),
                    torch.addmm(self.bias, x, self.weight.t()))

    module, x = Scaled().eval(), torch.randn(3, 4)
    program = _edge(module, (x,), max_bytes=0)
    assert not LinearWeights().run(program).changed
    assert aten.permute_copy.default in _calls(program)


def test_a_transposed_activation_is_left_alone() -> None:
    class Gram(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x @ y.t()

    program = _edge(Gram(), (torch.randn(3, 4), torch.randn(5, 4)), max_bytes=0)
    assert not LinearWeights().run(program).changed


def test_inspect_lists_no_transposed_copy_of_the_weight(tmp_path: Path) -> None:
    source = tmp_path / "tied.py"
    source.write_text(
        "import torch\n"
        "from torch import nn\n"
        "torch.manual_seed(0)\n"
        "class TiedLM(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(96, 16)\n"
        "        self.head = nn.Linear(16, 96, bias=False)\n"
        "        self.head.weight = self.embed.weight\n"
        "    def forward(self, ids):\n"
        "        return self.head(self.embed(ids))\n"
        "model = TiedLM().eval()\n"
        "example_inputs = (torch.randint(0, 96, (2, 5)),)\n")
    pte = tmp_path / "tied.pte"
    compiled = _exirc("compile", str(source), "--target", "exirc", "-o", str(pte), "--verify")
    assert compiled.returncode == 0, compiled.stderr
    listing = _exirc("inspect", str(pte), "--show", "instructions")
    assert listing.returncode == 0, listing.stderr
    head = [line for line in listing.stdout.splitlines() if "[head]" in line]
    assert len(head) == 1 and "aten::linear.out" in head[0], listing.stdout
    assert "permute_copy" not in listing.stdout


def _exirc(*args: str) -> subprocess.CompletedProcess[str]:
    return warm_exirc.exirc(args, text=True, timeout=120)


# ---------------------------------------------------------------------------
# A file's linear calls: checked at load, never trusted.
# ---------------------------------------------------------------------------

F32, I64 = P.ScalarType.FLOAT, P.ScalarType.LONG


def _linear_program(x: list[int], weight: list[int], bias: list[int] | None, out: list[int],
                    weight_type: P.ScalarType = F32) -> bytes:
    """aten::linear.out(input, weight, bias, *, out) on planned memory."""
    values: list[P.EValue] = [planned(0, x), planned(256, weight, weight_type),
                              planned(512, bias) if bias is not None else P.Null(),
                              planned(768, out)]
    inputs = [0, 1] + ([2] if bias is not None else [])
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::linear.out"],
                    inputs=inputs, outputs=[3], arena=1024)
    return serialize(program)


def test_a_well_formed_linear_call_runs() -> None:
    x, weight, bias = torch.randn(2, 3), torch.randn(4, 3), torch.randn(4)
    (out,) = load(_linear_program([2, 3], [4, 3], [4], [2, 4])).run("forward", [x, weight, bias])
    torch.testing.assert_close(out, F.linear(x, weight, bias))


@pytest.mark.parametrize(("x", "weight", "bias", "out", "words"), [
    ([2, 3], [4, 5], [4], [2, 4], "refuses these arguments"),      # sizes do not chain
    ([2, 3], [4, 3], [4], [2, 5], "declared float32[2, 5]"),        # out of another size
    ([2, 3], [4, 3], [7], [2, 4], "refuses these arguments"),      # bias per other features
    ([2, 3], [2, 4, 3], None, [2, 4], "refuses these arguments"),  # a 3-D weight
], ids=["sizes", "out", "bias", "weight_rank"])
def test_malformed_linear_calls_are_refused_at_load(x: list[int], weight: list[int],
                                                    bias: list[int] | None, out: list[int],
                                                    words: str) -> None:
    with pytest.raises(FormatError, match="aten::linear.out") as raised:
        load(_linear_program(x, weight, bias, out))
    assert words in str(raised.value)


def test_a_weight_of_another_dtype_is_a_typed_error_when_it_runs() -> None:
    # torch's meta kernel for mm does not compare dtypes; its CPU kernel does.
    program = load(_linear_program([2, 3], [4, 3], None, [2, 4], I64))
    with pytest.raises(ExecutionError, match=r"aten::linear.out.*same dtype"):
        program.run("forward", [torch.randn(2, 3), torch.ones(4, 3, dtype=torch.long)])


def test_the_cli_names_the_malformed_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(_linear_program([2, 3], [4, 5], [4], [2, 4]))
    ran = _exirc("run", str(bad), "--random")
    assert ran.returncode == 3, ran.stderr
    assert ran.stderr.startswith("error[E0300]: ")
    assert "aten::linear.out" in ran.stderr and "refuses these arguments" in ran.stderr


@requires_executorch
@pytest.mark.parametrize("name", ["tied_with_bias", "3d_no_bias"])
def test_a_portable_program_with_linear_runs_on_executorch(name: str, tmp_path: Path) -> None:
    module, inputs = _model(name)
    result = _compile(module, inputs, tmp_path, fold=False, target="portable")
    assert "aten::linear" in _operators(result)
    (got,) = run_with_executorch(result.data, list(inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, module(*inputs), rtol=1e-5, atol=1e-5)
