"""`--quantize-embeddings int8|int4` with int8, 8da4w or 8da8w: embedding tables
as integer rows.

The lookups are ExecuTorch's quantized embedding kernels (`embedding_byte`,
`embedding_4bit`), outside XNNPACK: the file then needs that kernel library,
which `inspect`'s kernel line says. The default for 8da4w / 8da8w, and for
int8 on xnnpack, is `none`: tables stay float and the file needs no quantized
kernels (tests/quantize/test_dynamic_llms.py, and below for int8); int8 on
portable makes int8 rows unless told otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.errors import UsageError
from exirc.quantize import QuantizeConfig
from tests.executorch_without_quantized import run_executorch_without_quantized_kernels
from tests.oracle import requires_executorch
from tests.quantize.test_zoo_quantized import (
    assert_within_steps,
    output_steps,
    run_executorch,
    run_exirc,
)

KERNELS = {"int8": "quantized_decomposed::embedding_byte.out",
           "int4": "quantized_decomposed::embedding_4bit.out"}


class TiedLM(torch.nn.Module):
    """An embedding whose table is also the LM head's weight (as GPT-2's).

    Normalized before each linear layer, as language models are: an int8 row fed
    straight to a per-token quantization sits on a grid where the choice of
    parameters ties, and kernels break such ties differently from torch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(96, 64)
        self.norm1, self.norm2 = torch.nn.LayerNorm(64), torch.nn.LayerNorm(64)
        self.mlp = torch.nn.Linear(64, 64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + torch.nn.functional.gelu(self.mlp(self.norm1(x)))
        return torch.nn.functional.linear(self.norm2(x), self.embed.weight)


def _tokens(seed: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(seed)),)


_compiled: dict[tuple[str, str, str], CompileResult] = {}


def _compile(mode: str, embeddings: str, target: str = "xnnpack") -> CompileResult:
    key = (mode, embeddings, target)
    if key not in _compiled:
        torch.manual_seed(6)
        _compiled[key] = compile_module(TiedLM().eval(), _tokens(0), options=CompileOptions(
            target=target, quantize=mode, quantize_embeddings=embeddings, min_sqnr_db=0.0),
            warn=lambda message: None)
    return _compiled[key]


def assert_float_rounding_of_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within float32 rounding of the largest logit (tens here: sums of 64 products),
    where a per-element relative bound would fail on logits near zero."""
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def _needs(result: CompileResult) -> dict[str, list[str]]:
    from exirc.inspector.kernels import kernel_needs
    from exirc.serialize.reader import deserialize

    return {library["name"]: library["operators"]
            for library in kernel_needs(deserialize(result.data))["libraries"]}


@pytest.mark.parametrize("embeddings", ["int8", "int4"])
@pytest.mark.parametrize("mode", ["8da4w", "8da8w"])
def test_tables_are_integer_rows_read_by_the_quantized_embedding_kernels(
        mode: str, embeddings: str) -> None:
    result = _compile(mode, embeddings)
    assert _needs(result)["quantized"] == [KERNELS[embeddings]]
    plain = _compile(mode, "none")
    assert "quantized" not in _needs(plain)
    assert result.quantization is not None and plain.quantization is not None
    # The tied table is stored twice (integer rows for the lookup, the head's own
    # quantized weights), each smaller than the float table the plain file keeps.
    assert result.quantization.weight_bytes < plain.quantization.weight_bytes
    for seed in (1, 2):
        tokens = _tokens(seed)
        with torch.no_grad():
            want = result.quantized_modules["forward"](*tokens)
        assert_float_rounding_of_logits(run_exirc(result.data, tokens)[0], want)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
@pytest.mark.parametrize("embeddings", ["int8", "int4"])
def test_the_file_runs_on_executorch_with_its_quantized_kernels(embeddings: str,
                                                                target: str) -> None:
    result = _compile("8da4w", embeddings, target)
    tokens = _tokens(3)
    theirs, ours = run_executorch(result.data, tokens)[0], run_exirc(result.data, tokens)[0]
    # ExecuTorch's layer norm (portable's or XNNPACK's) rounds a last bit as torch's
    # does not, which can move a per-token quantization by a step: a row's logits
    # then differ by that step's effect (docs/quantization.md's stated bound).
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))
    assert float((theirs - ours).abs().max()) <= 5e-3 * float(ours.abs().max())


def test_embedding_quantization_applies_to_int8_and_the_8da_modes_only() -> None:
    with pytest.raises(UsageError, match="applies to int8, 8da4w and 8da8w, not int4-weight"):
        QuantizeConfig("int4-weight-only", embeddings="int8")
    with pytest.raises(UsageError, match="unknown embedding quantization 'int2'"):
        QuantizeConfig("8da4w", embeddings="int2")
    with pytest.raises(UsageError, match="--quantize-embeddings applies to --quantize int8"):
        compile_module(TiedLM().eval(), _tokens(0),
                       options=CompileOptions(quantize_embeddings="int8"))


def _operators(result: CompileResult) -> set[str]:
    return {op.name for plan in result.program.execution_plan for op in plan.operators}


@pytest.mark.parametrize("target, asked, table", [
    ("portable", None, "int8"), ("portable", "none", "float"),
    ("xnnpack", None, "float"), ("xnnpack", "int8", "int8")])
def test_static_int8_quantizes_tables_unless_a_delegate_runs_the_model(
        target: str, asked: str | None, table: str) -> None:
    """ExecuTorch's own int8 XNNPACK lowering keeps embedding tables float, so its
    file needs no kernels outside the delegates: ours does the same unless asked;
    on portable kernels the quantized library is needed anyway, so tables are rows."""
    result = compile_module(TiedLM().eval(), _tokens(0), options=CompileOptions(
        target=target, quantize="int8", quantize_embeddings=asked, min_sqnr_db=0.0))
    ops = _operators(result)
    assert ("quantized_decomposed::embedding_byte" in ops) == (table == "int8"), ops
    if target == "xnnpack" and asked is None:
        assert not {op for op in ops if op.startswith("quantized_decomposed::")}, ops


@requires_executorch
def test_an_int8_xnnpack_language_model_runs_without_the_quantized_kernels(
        tmp_path: Path) -> None:
    """Within one output step of the quantized model (float tables), on both runtimes."""
    from exirc.capture import MethodSource, capture
    from exirc.diagnostics.quantization import quantize_sources

    torch.manual_seed(6)
    model = TiedLM().eval()
    result = compile_module(model, _tokens(0), options=CompileOptions(
        target="xnnpack", quantize="int8", min_sqnr_db=0.0), warn=lambda message: None)
    source = MethodSource("forward", model, _tokens(0), None, None, "<module>")
    reference = quantize_sources({"forward": source}, {"forward": capture(source)},
                                 QuantizeConfig("int8"), ()).sources["forward"].module
    assert isinstance(reference, torch.fx.GraphModule)
    steps = output_steps(reference)
    for seed in (0, 3):
        tokens = _tokens(seed)
        with torch.no_grad():
            expected = [reference(*tokens)]
        directory = tmp_path / str(seed)
        directory.mkdir()
        theirs = run_executorch_without_quantized_kernels(result.data, tokens, directory)
        assert_within_steps(theirs, expected, steps, "ExecuTorch vs the quantized model")
        assert_within_steps(run_exirc(result.data, tokens), expected, steps,
                            "exirc vs the quantized model")


TIED_LM_FILE = '''\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(96, 64), torch.nn.Linear(64, 32)).eval()
example_inputs = (torch.randint(0, 96, (1, 7)),)
'''


@pytest.mark.parametrize("flags, library", [([], False), (["--quantize-embeddings", "int8"], True)])
def test_cli_int8_tables_on_xnnpack_are_an_explicit_choice(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str],
        library: bool) -> None:
    """`inspect`'s kernels line names the quantized library only when asked for."""
    from exirc.cli.app import main

    model_file, pte = tmp_path / "lm.py", tmp_path / "lm.pte"
    model_file.write_text(TIED_LM_FILE)
    assert main(["compile", str(model_file), "--quantize", "int8", "--target", "xnnpack",
                 *flags, "-o", str(pte)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["inspect", str(pte)]) == 0
    kernels = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("kernels: "))
    assert ("quantized (quantized_decomposed::embedding_byte.out)" in kernels) == library, \
        kernels
