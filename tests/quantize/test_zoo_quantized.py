"""`--quantize` on a zoo of real model families, checked three ways.

For each model of `tests.quantize.models` (MLP, CNN, MobileNet-style, ViT,
BERT, GPT-2) and each target (portable, xnnpack):

- int8: the program, run by exirc's runtime, equals the quantized reference
  (pt2e's `convert_pt2e` output, as `--verify` uses it) run in eager within
  one quantization step of the output; its accuracy against the float model
  is reported (a finite SQNR, above 10 dB) and the weights are stored in
  <= 0.3 of the bytes;
- int8/int4 weight-only (the language models and the MLP): equal to the
  rewritten reference within float rounding (dequantizing is exact), weights
  in <= 0.3 / <= 0.16 of the bytes;
- every file runs on ExecuTorch's runtime with exirc's results, and
  ExecuTorch's own quantized files (XNNPACKQuantizer, portable and XNNPACK)
  run on `exirc run` with ExecuTorch's results;
- the CLI: a user's own pt2e-quantized model file compiles and runs;
  `--quantize int8 --calibration-inputs` prints the weight and accuracy lines;
  the usage and model errors say what is wrong (--quantize int8 on a model
  pt2e already quantized finds nothing to quantize, and says so).

Every (model, target, mode) is compiled once (module-scoped caches); the
transformer models are marked slow.
"""

from __future__ import annotations

import importlib.util
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from torch.fx import GraphModule, Node

from exirc.cli.app import main
from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.render import human_bytes
from exirc.inspector.size import size_report
from exirc.runtime import load
from tests.executorch_without_quantized import run_executorch_without_quantized_kernels
from tests.oracle import requires_executorch
from tests.pattern_traces import trace_patterns_once
from tests.quantize.models import ZOO, QuantModel

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
TARGETS = ("portable", "xnnpack")
SMALL = ("mlp", "cnn", "mobilenet")
TRANSFORMERS = ("vit", "bert", "gpt2")
LANGUAGE = ("mlp", "bert", "gpt2")  # the weight-only modes' models
WEIGHT_ONLY = ("int8-weight-only", "int4-weight-only")
MAX_RATIO = {"int8": 0.3, "int8-weight-only": 0.3, "int4-weight-only": 0.16}
# int8 on xnnpack keeps embedding tables float (as ExecuTorch's lowering does):
# without them, a language model's weights are layers whose float biases and
# norms, and an int8 copy of a tied LM head, weigh more than its tables did.
MAX_RATIO_FLOAT_TABLES = 0.4
CALIBRATION_CASES = 3  # seeds 0 (the example inputs) .. 2
HELD_OUT_SEED = 17  # a case no observer saw


def _param(name: str, *rest: str) -> Any:
    """A parameter set for model `name`: transformers models are slow, and need
    transformers."""
    if name not in TRANSFORMERS:
        return pytest.param(name, *rest)
    return pytest.param(name, *rest, marks=[
        pytest.mark.slow,
        pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs transformers")])


def _params(names: tuple[str, ...]) -> list[Any]:
    return [_param(n) for n in names]


# --------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------


def _tensors(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _eager(module: torch.nn.Module, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t.detach().clone() for t in _tensors(module(*inputs))]


def _scalar(module: GraphModule, arg: Any) -> float:
    if isinstance(arg, Node) and arg.op == "get_attr":
        owner: Any = module
        for part in str(arg.target).split("."):
            owner = getattr(owner, part)
        return float(owner)
    return float(arg)


def output_steps(module: GraphModule) -> list[float | None]:
    """Per output of a quantized graph, its quantization step: the scale of the
    nearest per-tensor quantize upstream of it (None when there is none)."""
    quantizes = {torch.ops.quantized_decomposed.quantize_per_tensor.default,
                 torch.ops.quantized_decomposed.quantize_per_tensor.tensor}
    output = next(n for n in module.graph.nodes if n.op == "output")
    steps: list[float | None] = []
    for value in torch.utils._pytree.tree_leaves(output.args[0]):
        frontier, seen, step = [value], set(), None
        while frontier and step is None:  # breadth first: the nearest one
            node = frontier.pop(0)
            if not isinstance(node, Node) or node in seen:
                continue
            seen.add(node)
            if node.op == "call_function" and node.target in quantizes:
                step = _scalar(module, node.args[1])
            frontier.extend(node.all_input_nodes)
        steps.append(step)
    return steps


def assert_within_steps(got: list[torch.Tensor], expected: list[torch.Tensor],
                        steps: list[float | None], what: str) -> float:
    """Each output within one quantization step; returns the largest difference."""
    assert len(got) == len(expected) == len(steps), what
    worst = 0.0
    for i, (a, b, step) in enumerate(zip(got, expected, steps)):
        assert step is not None, f"{what}: output {i} is not quantized"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: output {i}"
        diff = float((a - b).abs().max())
        assert diff <= step * (1 + 1e-4), f"{what}: output {i} differs by {diff:.3g}, " \
                                          f"more than one step ({step:.3g})"
        worst = max(worst, diff)
    return worst


def assert_float_rounding(got: list[torch.Tensor], expected: list[torch.Tensor],
                          what: str) -> float:
    """Equal within float32 rounding (--verify's default tolerance)."""
    assert len(got) == len(expected), what
    for i, (a, b) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{what}: output {i}")
    return max(float((a - b).abs().max()) for a, b in zip(got, expected))


def write_npz(path: Path, inputs: tuple[Any, ...]) -> Path:
    numpy.savez(path, **{f"input_{i}": torch.as_tensor(t).numpy() for i, t in enumerate(inputs)})
    return path


def run_exirc(data: bytes, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    return [torch.as_tensor(o).clone()
            for o in load(data).method("forward").run([t.clone() for t in inputs])]


def run_executorch(data: bytes, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    """ExecuTorch's runtime, with its quantized kernel library loaded."""
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed::*)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(bytes(data))  # kept alive while the method runs
    method = program.load_method("forward")
    outputs = method.execute([t.clone() for t in inputs])
    return [o.clone() for o in outputs]


# --------------------------------------------------------------------------
# Module-scoped caches: each (model, mode) quantized once as a reference, each
# (model, target, mode) compiled once.
# --------------------------------------------------------------------------


@dataclass
class Reference:
    model: QuantModel
    float_module: torch.nn.Module
    quantized: GraphModule  # what --verify compares against, run in eager
    calibration: tuple[Path, ...]


class Zoo:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._references: dict[tuple[str, str, str], Reference] = {}
        self._calibration: dict[str, tuple[Path, ...]] = {}
        self._compiled: dict[tuple[str, str, str], CompileResult | Exception] = {}

    def calibration(self, name: str) -> tuple[Path, ...]:
        if name not in self._calibration:
            model = ZOO[name]
            self._calibration[name] = tuple(
                write_npz(self.directory / f"{name}_{seed}.npz", model.inputs(seed))
                for seed in range(CALIBRATION_CASES))
        return self._calibration[name]

    def reference(self, name: str, mode: str, target: str) -> Reference:
        """The quantized model `target`'s compile makes (static int8 keeps
        embedding tables float on xnnpack, int8 rows on portable): the one the
        compile verifies against, else, for a compile the target refuses, the
        same quantization made on its own."""
        from exirc.errors import TargetQuantizationError

        key = (name, mode, target)
        if key not in self._references:
            model = ZOO[name]
            try:
                quantized = self.compiled(name, target, mode).quantized_modules["forward"]
            except TargetQuantizationError:
                quantized = self._quantized(name, mode, target)
            assert isinstance(quantized, GraphModule)
            self._references[key] = Reference(model, model.module(), quantized,
                                              self.calibration(name))
        return self._references[key]

    def _quantized(self, name: str, mode: str, target: str) -> GraphModule:
        from exirc.capture import MethodSource, capture
        from exirc.diagnostics.quantization import quantize_sources
        from exirc.quantize import QuantizeConfig, default_embeddings

        embeddings = default_embeddings(mode, delegated=target == "xnnpack")
        model = ZOO[name]
        sources = {"forward": MethodSource("forward", model.module(), model.inputs(), None, None,
                                           "<module>")}
        quantized = quantize_sources(sources, {"forward": capture(sources["forward"])},
                                     QuantizeConfig(mode, embeddings=embeddings),
                                     self.calibration(name))
        module = quantized.sources["forward"].module
        assert isinstance(module, GraphModule)
        return module

    def compiled(self, name: str, target: str, mode: str) -> CompileResult:
        """The compile, once: a refusal (an ExircError) is raised again, not re-made."""
        from exirc.errors import ExircError

        key = (name, target, mode)
        if key not in self._compiled:
            options = CompileOptions(target=target, quantize=mode,
                                     calibration_inputs=self.calibration(name))
            model = ZOO[name]
            try:
                self._compiled[key] = compile_module(model.module(), model.inputs(),
                                                     options=options)
            except ExircError as error:
                self._compiled[key] = error
        outcome = self._compiled[key]
        if isinstance(outcome, ExircError):
            raise outcome
        return outcome


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("quantized_zoo"))


def _cases(model: QuantModel) -> list[tuple[Any, ...]]:
    return [model.inputs(), model.inputs(HELD_OUT_SEED)]


def _check_report(result: CompileResult, mode: str, what: str,
                  repacked_bytes: int = 0, float_tables: int = 0) -> None:
    """The weights' bytes against the float model's, each stored once: an
    embedding table tied to an LM head that XNNPACK runs is one constant the
    delegate reads in place. `repacked_bytes`: an int4 table the delegate reads
    packed its own way (see `_tied_int4_table_bytes`), the same values in other bytes.
    `float_tables`: embedding tables the mode keeps float (`_float_table_bytes`),
    counted on neither side: the ratio is the quantized layers'."""
    report = result.quantization
    assert report is not None, what
    assert report.mode == mode
    assert 0 < report.weight_bytes < report.float_weight_bytes, what
    assert size_report(result.data).duplicate_bytes == 0, what
    ratio = (report.weight_bytes - repacked_bytes - float_tables) / \
        (report.float_weight_bytes - float_tables)
    bound = MAX_RATIO_FLOAT_TABLES if float_tables else MAX_RATIO[mode]
    assert ratio <= bound, f"{what}: weights stored in {ratio:.3f} of the float bytes"
    assert report.accuracy, what
    for accuracy in report.accuracy:
        assert math.isfinite(accuracy.sqnr_db) and math.isfinite(accuracy.max_abs_error), what
        assert accuracy.sqnr_db > 10, f"{what}: SQNR {accuracy.sqnr_db:.1f} dB"
    sqnr = ", ".join(f"{a.sqnr_db:.1f} dB" for a in report.accuracy)
    error = max(a.max_abs_error for a in report.accuracy)
    print(f"{what}: weights {report.weight_bytes}/{report.float_weight_bytes} B "
          f"({report.weight_ratio:.3f}x), SQNR vs float {sqnr}, max abs error {error:.3g}")


# --------------------------------------------------------------------------
# exirc's program against the quantized reference, in exirc's runtime.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", _params(SMALL + TRANSFORMERS))
def test_int8_equals_the_quantized_reference_within_one_step(zoo: Zoo, name: str,
                                                             target: str) -> None:
    what = f"{name} int8 on {target}"
    reference = zoo.reference(name, "int8", target)
    result = zoo.compiled(name, target, "int8")
    steps = output_steps(reference.quantized)
    assert result.quantization is not None and result.quantization.quantized_ops > 0
    worst = 0.0
    for inputs in _cases(reference.model):
        expected = _eager(reference.quantized, inputs)
        worst = max(worst, assert_within_steps(run_exirc(result.data, inputs), expected,
                                               steps, what))
    tables = _float_table_bytes(reference.float_module) if target == "xnnpack" else 0
    _check_report(result, "int8", what, float_tables=tables)
    print(f"{what}: max diff vs the quantized reference {worst:.3g} (one step: {steps})")


def _float_table_bytes(module: torch.nn.Module) -> int:
    """The bytes of the embedding tables an int8 xnnpack file keeps float32, as
    ExecuTorch's int8 lowering does (each table once, tied or not)."""
    tables = {id(m.weight): m.weight for m in module.modules()
              if isinstance(m, torch.nn.Embedding)}
    return sum(t.numel() * t.element_size() for t in tables.values())


def _tied_int4_table_bytes(module: torch.nn.Module, result: CompileResult, target: str,
                           mode: str) -> int:
    """The packed bytes of an int4 embedding table tied to an LM head that XNNPACK
    runs weight-only: the lookup (portable `embedding_4bit`) and the delegate's
    filter (XNNPACK's qcint4, packed its own way) hold the same values in
    different bytes, so they cannot be one stored copy (an int8 table can, and is)."""
    model = getattr(module, "model", None)
    if target != "xnnpack" or mode != "int4-weight-only" or not result.delegation or \
            model is None or not hasattr(model, "get_output_embeddings"):
        return 0
    table, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is table.weight
    return table.weight.numel() // 2 if tied else 0  # two values a byte


def _grouped_linear_weights(module: GraphModule) -> bool:
    """Whether a weight-only model has a linear layer (not only embeddings) whose
    weights are in groups smaller than its rows: XNNPACK refuses those."""
    dequantize = torch.ops.quantized_decomposed.dequantize_per_channel_group.default
    for node in module.graph.nodes:
        if node.target != dequantize or all(
                u.target == torch.ops.aten.embedding.default for u in node.users):
            continue
        table = node.args[0]
        assert isinstance(table, Node)
        owner: Any = module
        for part in str(table.target).split("."):
            owner = getattr(owner, part)
        if node.args[6] < owner.shape[1]:
            return True
    return False


def _refused(zoo: Zoo, name: str, target: str, mode: str) -> bool:
    """A weight-only model with grouped linear weights on xnnpack: check that it is
    refused (never silently dequantized at every call) and say so."""
    from exirc.errors import TargetQuantizationError

    if target != "xnnpack" or mode == "int8" or \
            not _grouped_linear_weights(zoo.reference(name, mode, target).quantized):
        return False
    with pytest.raises(TargetQuantizationError, match="in groups of"):
        zoo.compiled(name, target, mode)
    return True


@pytest.mark.parametrize("mode", WEIGHT_ONLY)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", _params(LANGUAGE))
def test_weight_only_equals_the_rewritten_reference(zoo: Zoo, name: str, target: str,
                                                    mode: str) -> None:
    what = f"{name} {mode} on {target}"
    if _refused(zoo, name, target, mode):
        return
    reference = zoo.reference(name, mode, target)
    result = zoo.compiled(name, target, mode)
    assert result.quantization is not None and result.quantization.weights
    worst = 0.0
    for inputs in _cases(reference.model):
        expected = _eager(reference.quantized, inputs)
        worst = max(worst, assert_float_rounding(run_exirc(result.data, inputs), expected, what))
    _check_report(result, mode, what,
                  _tied_int4_table_bytes(reference.model.module(), result, target, mode))
    print(f"{what}: max diff vs the rewritten reference {worst:.3g}")


# --------------------------------------------------------------------------
# ExecuTorch's runtime on exirc's files.
# --------------------------------------------------------------------------

_ALL_COMPILES = [(n, m) for n in SMALL + TRANSFORMERS for m in ["int8"]] + \
    [(n, m) for n in LANGUAGE for m in WEIGHT_ONLY]


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("name", "mode"), [_param(*case) for case in _ALL_COMPILES])
def test_our_quantized_file_runs_on_executorch_like_exirc(zoo: Zoo, name: str, target: str,
                                                          mode: str) -> None:
    what = f"{name} {mode} on {target}, ExecuTorch vs exirc"
    if _refused(zoo, name, target, mode):
        return
    result = zoo.compiled(name, target, mode)
    model = ZOO[name]
    for inputs in _cases(model):
        ours = run_exirc(result.data, inputs)
        theirs = run_executorch(result.data, inputs)
        if mode == "int8":
            steps = output_steps(zoo.reference(name, mode, target).quantized)
            worst = assert_within_steps(theirs, ours, steps, what)
        else:
            worst = assert_float_rounding(theirs, ours, what)
        print(f"{what}: max diff {worst:.3g}")


# --------------------------------------------------------------------------
# ExecuTorch's own quantized files on `exirc run`.
# --------------------------------------------------------------------------


def _executorch_quantized(name: str, lowering: str) -> tuple[bytes, GraphModule]:
    """Model `name` quantized by ExecuTorch's XNNPACKQuantizer (per-channel
    symmetric) through torchao's pt2e, lowered by ExecuTorch: (file, converted)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model = ZOO[name]
    inputs = model.inputs()
    captured = torch.export.export(model.module(), inputs).module()
    trace_patterns_once()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(
        is_per_channel=True))
    prepared = prepare_pt2e(captured, quantizer)
    with torch.no_grad():
        for seed in range(CALIBRATION_CASES):
            prepared(*model.inputs(seed))
    converted = convert_pt2e(prepared)
    exported = torch.export.export(converted, inputs)
    if lowering == "portable":
        edge = to_edge(exported)
    else:
        edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer), converted


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("lowering", TARGETS)
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_executorchs_quantized_file_runs_on_exirc_run(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path, name: str,
                                                      lowering: str) -> None:
    what = f"ExecuTorch's {name} ({lowering}), exirc run vs ExecuTorch"
    data, converted = _executorch_quantized(name, lowering)
    pte = tmp_path / f"{name}.pte"
    pte.write_bytes(data)
    steps = output_steps(converted)
    for seed, inputs in enumerate(_cases(ZOO[name])):
        out = tmp_path / f"out_{seed}.npz"
        code = main(["run", str(pte), "--inputs", str(write_npz(tmp_path / f"in_{seed}.npz",
                                                                 inputs)), "-o", str(out)])
        err = capsys.readouterr().err
        assert code == 0, err
        with numpy.load(out) as arrays:
            ours = [torch.from_numpy(arrays[f"output_{i}"]) for i in range(len(arrays.files))]
        theirs = run_executorch(data, inputs)
        worst = assert_within_steps(ours, theirs, steps, what)
        print(f"{what}: max diff {worst:.3g} (one step: {steps})")


# --------------------------------------------------------------------------
# The command line.
# --------------------------------------------------------------------------

USER_PT2E = """\
import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.drop = torch.nn.Dropout(0.5)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(torch.flatten(y, 1)))


example_inputs = (torch.randn(1, 3, 8, 8),)
captured = torch.export.export(Net().eval(), example_inputs).module()
quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
prepared = prepare_pt2e(captured, quantizer)
for _ in range(4):
    prepared(torch.randn(1, 3, 8, 8))
model = convert_pt2e(prepared)  # as pt2e returns it: not .eval()-ed
"""

MLP = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 16)).eval()
example_inputs = (torch.randn(4, 64),)
"""
MLP_FLOAT_BYTES = (64 * 128 + 128 + 128 * 16 + 16) * 4

NOTHING_TO_QUANTIZE = """\
import torch


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, dim=-1)


model = Softmax().eval()
example_inputs = (torch.randn(4, 8),)
"""


def _write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def _compile(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compile", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", TARGETS)
def test_a_users_pt2e_model_file_compiles_and_runs(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, target: str) -> None:
    import runpy

    from torchao.quantization.pt2e import move_exported_model_to_eval

    model_file = _write(tmp_path, "user_pt2e.py", USER_PT2E)
    pte = tmp_path / "x.pte"
    code, _, err = _compile(capsys, str(model_file), "--target", target, "-o", str(pte))
    assert code == 0, err

    names = runpy.run_path(str(model_file))
    converted: GraphModule = names["model"]
    move_exported_model_to_eval(converted)
    steps = output_steps(converted)
    inputs = (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3)),)
    expected = _eager(converted, inputs)
    data = pte.read_bytes()
    worst = assert_within_steps(run_exirc(data, inputs), expected, steps,
                                f"user pt2e model on {target}")
    assert_within_steps(run_executorch(data, inputs), expected, steps,
                        f"user pt2e model on {target}, ExecuTorch")
    print(f"user pt2e model on {target}: max diff vs eager {worst:.3g} (one step: {steps})")


def test_cli_int8_with_calibration_inputs_prints_weights_and_accuracy(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_file = _write(tmp_path, "mlp.py", MLP)
    generator = torch.Generator().manual_seed(1)
    calibration = write_npz(tmp_path / "a.npz", (torch.randn(4, 64, generator=generator),))
    pte = tmp_path / "x.pte"

    code, out, err = _compile(capsys, str(model_file), "--quantize", "int8",
                              "--calibration-inputs", str(calibration), "-o", str(pte))

    assert code == 0, err
    assert out == ""
    lines = err.splitlines()
    quantized = [line for line in lines if line.startswith("  quantized int8: ")]
    assert len(quantized) == 1, err
    assert quantized[0].startswith("  quantized int8: 2 conv/linear layers, calibrated on ")
    assert "calibrated on " in quantized[0] and "a.npz; accuracy measured on " in quantized[0]
    assert quantized[0].endswith("a.npz (the inputs calibrated on: --verify-inputs measures "
                                 "on others)"), quantized[0]
    weights = [line for line in lines if line.startswith("  weights ")]
    assert len(weights) == 1, err
    parsed = weights[0].split()
    assert " ".join(parsed[1:4]) == f"{human_bytes(MLP_FLOAT_BYTES)} float", weights[0]
    ratio = float(parsed[-1].strip("()x"))
    assert 0 < ratio <= 0.3, weights[0]
    accuracy = [line for line in lines if line.startswith("  accuracy vs float, forward "
                                                          "output 0: SQNR ")]
    assert len(accuracy) == 1, err
    sqnr = float(accuracy[0].split("SQNR ")[1].split(" dB")[0])
    assert sqnr > 10, accuracy[0]
    assert ", max abs error " in accuracy[0]
    assert run_exirc(pte.read_bytes(), (torch.randn(4, 64),))[0].shape == (4, 16)


def test_cli_calibration_inputs_without_quantize_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_file = _write(tmp_path, "mlp.py", MLP)
    calibration = write_npz(tmp_path / "a.npz", (torch.randn(4, 64),))
    pte = tmp_path / "x.pte"

    code, out, err = _compile(capsys, str(model_file), "--calibration-inputs", str(calibration),
                              "-o", str(pte))

    assert code == 2, err
    assert "--quantize" in err and "E0200" in err, err
    assert not pte.exists()


def test_int8_on_an_already_quantized_model_quantizes_nothing() -> None:
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from exirc.errors import ModelError
    from exirc.quantize.quantizer import make_quantizer

    torch.manual_seed(0)
    float_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                      torch.nn.Linear(128, 16)).eval()
    inputs = (torch.randn(4, 64),)
    prepared = prepare_pt2e(torch.export.export(float_model, inputs).module(), make_quantizer())
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    with pytest.raises(ModelError, match="found nothing to quantize"):
        compile_module(converted, inputs, options=CompileOptions(quantize="int8"))


@pytest.mark.parametrize("mode", ["int8", "int4-weight-only"])
def test_cli_a_model_with_nothing_to_quantize_is_a_clear_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, mode: str) -> None:
    model_file = _write(tmp_path, "softmax.py", NOTHING_TO_QUANTIZE)
    pte = tmp_path / "x.pte"

    code, _, err = _compile(capsys, str(model_file), "--quantize", mode, "-o", str(pte))

    assert code == 3, err
    assert f"method 'forward': --quantize {mode} found nothing to quantize" in err, err
    assert "E0310" in err and "compile without --quantize" in err, err
    assert "Traceback" not in err
    assert not pte.exists()


# --------------------------------------------------------------------------
# Deployable int8 XNNPACK files: no quantized kernels outside the delegate.
# --------------------------------------------------------------------------


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("name", _params(("mlp", "cnn", "vit", "bert", "gpt2")))
def test_int8_xnnpack_file_runs_on_executorch_without_its_quantized_kernels(
        zoo: Zoo, name: str, tmp_path: Path) -> None:
    what = f"{name} int8 on xnnpack, ExecuTorch without quantized kernels"
    from exirc.inspector.kernels import kernel_needs

    reference = zoo.reference(name, "int8", "xnnpack")
    result = zoo.compiled(name, "xnnpack", "int8")
    libraries = [lib["name"] for lib in kernel_needs(result.program)["libraries"]]
    assert "quantized" not in libraries, f"{what}: {kernel_needs(result.program)}"
    steps = output_steps(reference.quantized)
    for index, inputs in enumerate(_cases(reference.model)):
        directory = tmp_path / str(index)
        directory.mkdir()
        got = run_executorch_without_quantized_kernels(result.data, inputs, directory)
        worst = assert_within_steps(got, _eager(reference.quantized, inputs), steps, what)
        print(f"{what}: max diff vs the quantized model {worst:.3g}")
