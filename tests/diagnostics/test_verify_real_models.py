"""`--verify` on the graphs real models make: `arange`, `_to_copy(dtype=...)`,
Hugging Face BERT and LLaMA (tiny, from a config, random weights), and
half-precision models, whose default tolerance follows their dtype.

A wrong kernel is injected (through the API's `kernels=`, or a `--plugin`
module through the command line, in a subprocess so the default registry of
this process stays clean) and the localizer must name its instruction.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from exirc.capture import MethodSource, load_model
from exirc.cli.app import main
from exirc.compiler import CompileOptions, CompileResult, compile_model, compile_module
from exirc.diagnostics.bundle import check_bundled
from exirc.diagnostics.compare import compare
from exirc.diagnostics.divergence import PLANNED, LocalizeError, describe_failure
from exirc.diagnostics.eager_check import verify_compiled
from exirc.diagnostics.tolerance import Tolerance
from exirc.runtime import load
from exirc.runtime.kernels.registry import KERNELS, KernelRegistry
from tests.compile.test_cli_compile import write

MIXED = """\
import torch

torch.manual_seed(0)


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        # Over the dynamic batch: an arange of a static size is folded at compile time.
        positions = torch.arange(x.shape[0], dtype=torch.float32)[:, None]
        h = torch.relu(self.fc(x + positions))
        return h.to(torch.float16).float() * 2


model = Mixed().eval()
example_inputs = (torch.randn(2, 8),)
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=16)}}
"""

BERT = """\
import torch
from transformers import BertConfig, BertModel

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=32, attn_implementation="eager")


class Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, ids):
        return self.bert(input_ids=ids).last_hidden_state


model = Bert().eval()
example_inputs = (torch.randint(0, 64, (1, 8)),)
"""

LLAMA = """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, intermediate_size=32, max_position_embeddings=32,
                     attn_implementation="eager", use_cache=False)


class Llama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.llama = LlamaForCausalLM(config)

    def forward(self, ids):
        return self.llama(input_ids=ids, use_cache=False).logits


model = Llama().eval()
example_inputs = (torch.randint(0, 64, (1, 8)),)
"""

# A wrong kernel for the command line: a plugin module registering it.
WRONG_GELU = """\
import torch
from exirc.runtime import register_kernel


@register_kernel("aten::gelu.out")
def relu_not_gelu(x, approximate="none", *, out):
    return torch.clamp(x, min=0, out=out)
"""

SOURCES = {"mixed": MIXED, "bert": BERT, "llama": LLAMA}


def registry(op: str, kernel: Callable[..., Any]) -> KernelRegistry:
    kernels = KernelRegistry(parent=KERNELS)
    kernels.register(op, kernel)
    return kernels


def instructions(result: CompileResult, op: str) -> list[int]:
    plan = result.program.method("forward")
    names = [plan.operators[i.op_index].qualified_name if hasattr(i, "op_index") else ""
             for i in plan.chains[0].instructions]
    return [i for i, name in enumerate(names) if name == op]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[dict[str, tuple[CompileResult, dict[str, MethodSource], Path]]]:
    """Each model compiled (no verification) from its own directory's model.py."""
    models = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, source in SOURCES.items():
            directory = tmp_path_factory.mktemp(name)
            write(directory, "model.py", source)
            patch.chdir(directory)
            models[name] = (compile_model("model.py"), load_model("model.py").methods, directory)
        yield models


# --------------------------------------------------------------------------
# arange and _to_copy(dtype=...): the planned graph runs in torch, and the
# localizer names the wrong kernel wherever it is.
# --------------------------------------------------------------------------


def leaky_relu(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, 0.1 * x, out=out)


def shifted_arange(start: Any, end: Any, step: Any = 1, *, out: torch.Tensor) -> torch.Tensor:
    return torch.arange(start, end, step, out=out).add_(1)


def truncating_copy(x: torch.Tensor, non_blocking: bool = False, memory_format: Any = None, *,
                    out: torch.Tensor) -> torch.Tensor:
    # Rounds to bfloat16, not to out's float16; resized as out= kernels do (the
    # planned out has the batch's upper bound).
    return out.resize_(x.shape).copy_(x.to(torch.bfloat16))


@pytest.mark.parametrize(("op", "kernel", "node"), [
    ("aten::relu.out", leaky_relu, "relu"),
    ("aten::arange.start_out", shifted_arange, "arange"),
])
def test_a_graph_with_arange_and_to_copy_is_localized(
        compiled: dict[str, Any], op: str, kernel: Callable[..., Any], node: str) -> None:
    result, sources, _ = compiled["mixed"]
    assert verify_compiled(result, sources).ok
    assert instructions(result, "aten::_to_copy.out")  # the casts are instructions

    report = verify_compiled(result, sources, kernels=registry(op, kernel))

    (case,) = report.cases
    assert not case.ok and case.localization_note == ""
    divergence = case.divergence
    assert divergence is not None and divergence.against == PLANNED
    assert (divergence.op, divergence.node) == (op, node)
    assert [divergence.instruction] == instructions(result, op)
    assert divergence.source is not None and "model.py:" in divergence.source


def test_a_wrong_cast_is_localized_to_its_to_copy(compiled: dict[str, Any]) -> None:
    result, sources, _ = compiled["mixed"]
    report = verify_compiled(result, sources,
                             kernels=registry("aten::_to_copy.out", truncating_copy))
    divergence = report.cases[0].divergence
    assert divergence is not None, report.cases[0]
    assert divergence.op == "aten::_to_copy.out"
    assert divergence.instruction == instructions(result, "aten::_to_copy.out")[0]
    assert divergence.node.startswith("_to_copy")


# --------------------------------------------------------------------------
# Hugging Face models.
# --------------------------------------------------------------------------


def wrong_softmax(x: torch.Tensor, dim: int, half_to_float: bool, *,
                  out: torch.Tensor) -> torch.Tensor:
    return out.copy_(torch.softmax(x * 0.5, dim))


def test_llama_verifies_and_a_wrong_softmax_is_localized(compiled: dict[str, Any]) -> None:
    result, sources, _ = compiled["llama"]
    assert not instructions(result, "aten::arange.start_out")  # positions: folded
    assert verify_compiled(result, sources).ok

    report = verify_compiled(result, sources,
                             kernels=registry("aten::_softmax.out", wrong_softmax))

    divergence = report.cases[0].divergence
    assert divergence is not None, report.cases[0].localization_note
    assert divergence.op == "aten::_softmax.out"
    assert [divergence.instruction] == instructions(result, "aten::_softmax.out")
    assert divergence.module is not None and "(LlamaAttention)" in divergence.module


def test_bert_verifies_and_a_wrong_gelu_is_localized(compiled: dict[str, Any]) -> None:
    result, sources, _ = compiled["bert"]
    assert not instructions(result, "aten::arange.start_out")  # positions: folded
    assert verify_compiled(result, sources).ok

    report = verify_compiled(result, sources, kernels=registry(
        "aten::gelu.out", lambda x, approximate="none", *, out: torch.clamp(x, min=0, out=out)))

    divergence = report.cases[0].divergence
    assert divergence is not None, report.cases[0].localization_note
    assert divergence.op == "aten::gelu.out"
    assert [divergence.instruction] == instructions(result, "aten::gelu.out")
    assert divergence.module is not None and "(GELUActivation)" in divergence.module


def test_the_command_line_localizes_a_plugins_wrong_kernel_in_bert(
        compiled: dict[str, Any]) -> None:
    result, _, directory = compiled["bert"]
    write(directory, "wrong_gelu.py", WRONG_GELU)

    run = subprocess.run([sys.executable, "-m", "exirc", "compile", "model.py", "--verify",
                          "--plugin", "wrong_gelu.py", "-o", "bad.pte"], cwd=directory,
                         capture_output=True, text=True, timeout=300, check=False)

    assert run.returncode == 5, run.stderr
    assert not (directory / "bad.pte").exists()
    lines = run.stderr.splitlines()
    assert lines[0].startswith("error[E0500]: method 'forward' differs from eager PyTorch")
    (gelu,) = instructions(result, "aten::gelu.out")
    assert f"    first diverging instruction: {gelu} aten::gelu.out (node %gelu)" in lines
    assert "Traceback" not in run.stderr and "While executing" not in run.stderr
    assert "could not localize" not in run.stderr


# --------------------------------------------------------------------------
# A failure to localize is one line, naming the node torch could not run.
# --------------------------------------------------------------------------


def test_a_failure_to_localize_is_one_line() -> None:
    class Relu(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) + 1

    x = torch.randn(3, 4)
    result = compile_module(Relu(), (x,))
    node = next(n for n in result.planned["forward"].graph_module.graph.nodes
                if n.op == "call_function" and "relu" in str(n.target))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("first line\n\nWhile executing %relu\nOriginal traceback:\n  ...")

    node.target = broken
    source = MethodSource("forward", Relu(), (x,), None, None, "<module>")
    report = verify_compiled(result, {"forward": source},
                             kernels=registry("aten::relu.out", leaky_relu))

    (case,) = report.cases
    assert case.divergence is None
    assert case.localization_note == (
        "(could not localize the difference: torch cannot run node %relu (broken) of the "
        "planned graph: RuntimeError: first line)")
    assert "\n" not in report.failure_message().split("\n", 2)[-1]
    assert describe_failure(ValueError("a\nb")) == "ValueError: a"
    assert describe_failure(LocalizeError("c\nd")) == "c"


# --------------------------------------------------------------------------
# Tolerances by dtype.
# --------------------------------------------------------------------------

HALF = """\
import torch

torch.manual_seed(0)


class Half(torch.nn.Module):
    # lerp and logsumexp decompose into several ops, each rounding to the dtype
    def forward(self, x):
        return torch.lerp(x, x.flip(0), 0.3), torch.logsumexp(x, -1)


model = Half().eval()
example_inputs = ((torch.randn(16, 64) * 3).to(torch.DTYPE),)
"""


@pytest.mark.parametrize(("dtype", "rtol"), [("float16", "0.001"), ("bfloat16", "0.016")])
def test_half_precision_models_verify_with_their_dtypes_tolerance(
        dtype: str, rtol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", HALF.replace("DTYPE", dtype))

    # exirc's float32 tolerance is too tight for these: given explicitly, it fails
    code = main(["compile", "model.py", "--verify", "--rtol", "1e-4", "--atol", "1e-5",
                 "-o", "tight.pte"])
    err = capsys.readouterr().err
    assert code == 5, err
    assert "(rtol 0.0001, atol 1e-05)" in err.splitlines()[0]
    assert not (tmp_path / "tight.pte").exists()

    code = main(["compile", "model.py", "--verify", "--bundle", "-o", "model.pte"])
    err = capsys.readouterr().err
    assert code == 0, err
    verified = err.splitlines()[-1]
    assert verified.startswith("verified: 2 outputs match eager PyTorch (max abs error ")
    assert verified.endswith(f"; {dtype}: rtol {rtol}, atol 1e-05)"), verified
    # the bundled cases carry that tolerance
    bundle, checked = check_bundled(load(tmp_path / "model.pte"))
    assert (bundle.rtol, bundle.atol) == (float(rtol), 1e-5)
    assert checked and all(case.ok for case in checked)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_wrong_kernel_still_fails_a_half_precision_model(dtype: torch.dtype, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", HALF.replace("DTYPE", str(dtype).removeprefix("torch.")))
    result = compile_model("model.py")
    sources = load_model("model.py").methods
    assert verify_compiled(result, sources).ok

    report = verify_compiled(result, sources, kernels=registry(
        "aten::flip.out", lambda x, dims, *, out: out.copy_(x)))  # no flip

    assert not report.ok
    divergence = report.cases[0].divergence
    assert divergence is not None and divergence.op == "aten::flip.out"
    name = str(dtype).removeprefix("torch.")
    rtol = {"float16": "0.001", "bfloat16": "0.016"}[name]
    assert report.failure_message().splitlines()[0].endswith(f"({name}: rtol {rtol}, atol 1e-05)")


def test_compare_uses_the_tolerance_of_the_expected_dtype() -> None:
    expected = torch.tensor([1.0, 2.0, 4.0])
    off = expected * (1 + 5e-4)  # between float32's rtol 1e-4 and float16's 1e-3
    assert not compare(off, expected, Tolerance()).ok
    assert compare(off.half(), expected.half(), Tolerance()).ok
    assert not compare(off.half(), expected.half(), Tolerance(rtol=1e-4)).ok  # explicit wins
    off = expected * (1 + 1e-2)
    assert not compare(off.half(), expected.half(), Tolerance()).ok
    assert compare(off.bfloat16(), expected.bfloat16(), Tolerance()).ok
    assert compare(numpy.float32(1.00005), 1.0, Tolerance()).ok  # numbers: exirc's defaults


def test_tolerance_describes_the_dtypes_it_was_used_for() -> None:
    tolerance = Tolerance()
    assert tolerance.for_dtype("float32") == (1e-4, 1e-5)
    assert tolerance.for_dtype("float16") == (1e-3, 1e-5)
    assert tolerance.for_dtype("bfloat16") == (1.6e-2, 1e-5)
    assert tolerance.describe() == tolerance.describe(["float32"]) == "rtol 0.0001, atol 1e-05"
    assert tolerance.describe(["float16"]) == "float16: rtol 0.001, atol 1e-05"
    assert tolerance.describe(["bfloat16", "float32"]) == (
        "rtol 0.0001, atol 1e-05; bfloat16: rtol 0.016, atol 1e-05")
    assert Tolerance(rtol=0.5).describe(["float16"]) == "rtol 0.5, atol 1e-05"
    assert Tolerance(atol=0.5).describe(["float16"]) == "float16: rtol 0.001, atol 0.5"
    assert tolerance.loosest(["float16", "float32"]) == (1e-3, 1e-5)
    assert tolerance.loosest([]) == (1e-4, 1e-5)


def test_compile_options_default_to_the_dtype_tolerance() -> None:
    options = CompileOptions(verify=True)
    assert (options.rtol, options.atol) == (None, None)
