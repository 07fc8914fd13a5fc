"""The ONNX form's peephole fusions (exirc.runtime.engines.onnx_form.rewrites.fusions): a layer
norm lowered to XNNPACK's ~10 nodes runs as one LayerNormalization on
onnxruntime, with the answers of the torch engine and of eager PyTorch; runs
that are not exactly a layer norm (an intermediate read elsewhere, a clamp in
the middle, statistics over part of the normalised dims, eps or weights that
do not fit) are emitted node by node and still give the right answer."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.delegates.xnnpack.backend import XnnpackBackend
from exirc.runtime.delegates.xnnpack.pooling import FLAG_KEEP_DIMS
from exirc.runtime.engines.onnx_form import xnnpack_graph as onnx_graph
from exirc.runtime.engines.onnxruntime.delegate import OnnxDelegate
from exirc.runtime.engines.onnxruntime.engine import ONNXRUNTIME_ENGINE
from exirc.runtime.engines.policy import EnginePolicy
from exirc.serialize.xnnpack import graph as G
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.graphs import GraphBuilder, NamedContext
from tests.runtime.delegates.xnnpack.zoo import ZOO, ZooModel, eager, executorch_xnnpack_pte

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

RTOL, ATOL = 1e-3, 1e-4  # the verify tolerances of the XNNPACK runtime tests
Kind = G.NodeKind


@pytest.fixture
def onnx_ops(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The op types of each ONNX model made while the test runs, one list a delegate."""
    made: list[list[str]] = []
    convert = onnx_graph.to_onnx

    def spy(graph: G.XNNGraph, compiled: Any) -> onnx_graph.OnnxModel:
        model = convert(graph, compiled)
        made.append([node.op_type for node in model.model.graph.node])
        return model
    monkeypatch.setattr(onnx_graph, "to_onnx", spy)
    return made


def assert_close(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor],
                 what: str) -> None:
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, f"{what}: output {i}"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{what}: output {i}")


def on_both_engines(data: bytes, inputs: Sequence[torch.Tensor],
                    monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The program's outputs on onnxruntime, checked against the reference's."""
    on_ort = load(data, engine="onnxruntime").run("forward", [t.clone() for t in inputs])
    on_reference = load(data, engine="reference").run("forward", [t.clone() for t in inputs])
    assert_close(on_ort, on_reference, "onnxruntime vs the reference")
    return on_ort


def compiled_against_eager(model: nn.Module, inputs: Sequence[torch.Tensor],
                           monkeypatch: pytest.MonkeyPatch, rtol: float, atol: float) -> None:
    """Compile `model` for XNNPACK and check its outputs on onnxruntime against the
    torch engine's (`on_both_engines`) and eager's, within `rtol`/`atol`."""
    data = compile_module(model, list(inputs), options=CompileOptions(target="xnnpack")).data
    ours = on_both_engines(data, inputs, monkeypatch)
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    assert len(ours) == len(expected)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def run_hand_built(g: GraphBuilder, inputs: Sequence[torch.Tensor],
                   monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.Tensor],
                                                             list[torch.Tensor]]:
    """A hand-built graph's outputs on onnxruntime (which must take it), and the
    torch path's."""
    blob = g.finish()
    compiled = XnnpackBackend().prepare(blob, NamedContext(g.named))  # type: ignore[arg-type]
    delegate = ONNXRUNTIME_ENGINE.prepare_delegate("XnnpackBackend", compiled,
                                                   EnginePolicy("onnxruntime"))
    assert isinstance(delegate, OnnxDelegate)
    outputs = [torch.empty(blob.graph.values[v].dims) for v in blob.graph.output_ids]
    delegate.execute([*inputs, *outputs])
    return outputs, g.run(*inputs, compiled=compiled)


def _randomised(norm: nn.Module) -> nn.Module:
    # The default ones and zeros would hide a weight or bias applied wrongly.
    with torch.no_grad():
        for parameter in norm.parameters():
            parameter.normal_()
    return norm


def _normed(norm: Callable[[], nn.Module], width: int = 32) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(nn.Linear(width, width), norm(), nn.Hardtanh(-1.5, 1.5))


LAYER_NORMS = [
    ZooModel("ln_affine", _normed(lambda: _randomised(nn.LayerNorm(32))),
             lambda: (torch.randn(1, 17, 32) * 3 + 5,)),
    ZooModel("ln_plain", _normed(lambda: nn.LayerNorm(32, elementwise_affine=False)),
             lambda: (torch.randn(2, 9, 32),)),
    ZooModel("ln_no_bias", _normed(lambda: _randomised(nn.LayerNorm(32, bias=False))),
             lambda: (torch.randn(3, 32),)),
    # A group norm's statistics are the same run, on [N * groups, C / groups * H * W,
    # 1, 1]; its per-channel affine part is not a LayerNormalization scale.
    ZooModel("group_norm", lambda: _randomised(nn.GroupNorm(2, 6)),
             lambda: (torch.randn(2, 6, 3, 3),)),
    ZooModel("ln_two_dims", _normed(lambda: _randomised(nn.LayerNorm((4, 8))), width=8),
             lambda: (torch.randn(2, 5, 4, 8),)),
]


@pytest.mark.parametrize("model", LAYER_NORMS, ids=lambda m: m.name)
def test_a_layer_norm_is_one_operator_with_the_same_answers(
        model: ZooModel, onnx_ops: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    data = compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack")).data
    outputs = on_both_engines(data, model.inputs(), monkeypatch)
    assert_close(outputs, eager(model), f"{model.name}: onnxruntime vs eager")
    (ops,) = onnx_ops
    assert ops.count("LayerNormalization") == 1, ops
    assert not {"ReduceMean", "Sub", "Sqrt", "Reciprocal"} & set(ops), ops


TRANSFORMERS = [("tiny_vit", 2, 1), ("gpt2_tiny", 5, 0), ("bert_tiny", 5, 0)]
"""Zoo models, their layer norms and their other means: the ViT has one block (two
norms) and pools its tokens with a mean; GPT-2 and BERT have two blocks of two
norms, plus GPT-2's final norm and BERT's embedding norm."""


@pytest.mark.parametrize(("name", "norms", "means"), TRANSFORMERS)
def test_transformer_layer_norms_are_fused(name: str, norms: int, means: int,
                                           onnx_ops: list[list[str]],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = ZOO[name]
    if model.needs and importlib.util.find_spec(model.needs) is None:
        pytest.skip(f"needs {model.needs}")
    data = compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack")).data
    outputs = on_both_engines(data, model.inputs(), monkeypatch)
    assert_close(outputs, eager(model), f"{name}: onnxruntime vs eager")
    ops = [op for delegate in onnx_ops for op in delegate]
    assert ops.count("LayerNormalization") == norms, ops
    assert ops.count("ReduceMean") == means, ops


@requires_executorch
@pytest.mark.parametrize("affine", [True, False])
def test_executorch_lowering_of_a_layer_norm(affine: bool, onnx_ops: list[list[str]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """ExecuTorch's XnnpackPartitioner keeps aten.native_layer_norm out of its
    delegates (a portable kernel runs it), so there is no decomposition to fuse;
    what is delegated around it runs on onnxruntime with eager's answers."""
    model = ZooModel("ln_executorch", _normed(lambda: _randomised(
        nn.LayerNorm(32, elementwise_affine=affine))), lambda: (torch.randn(1, 17, 32),))
    data = executorch_xnnpack_pte(model)
    program = load(data, engine="onnxruntime")
    assert_close(program.run("forward", list(model.inputs())), eager(model),
                 "executorch lowering on onnxruntime vs eager")
    operators = {op.name for plan in program.program.execution_plan for op in plan.operators}
    assert "aten::native_layer_norm" in operators
    assert onnx_ops and not any("ReduceMean" in ops for ops in onnx_ops)


# -- graphs built by hand: what is fused and what is declined --------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    """A hand-built layer norm over [N, H, 1, C] (C = 1 unless said), and what it breaks."""

    name: str
    fuses: bool
    channels: int = 1
    swap: bool = False  # commutative operands the other way round
    eps: float = 1e-5
    eps_at_run_time: bool = False
    weight_shape: tuple[int, ...] = (1, 8, 1, 1)
    mean_is_output: bool = False
    centered_read_again: bool = False
    clamp_on: str | None = None  # "eps" (the ADD of eps, in the middle) or "bias" (the last)
    bias: bool = True
    ops: tuple[str, ...] | None = None  # the whole ONNX model, where it says something


VARIANTS = [
    Variant("plain", True, ops=("Reshape", "LayerNormalization")),
    Variant("operands_swapped", True, swap=True),
    Variant("weight_as_hw1", True, weight_shape=(8, 1, 1)),
    Variant("clamp_on_the_last", True, clamp_on="bias",
            ops=("Reshape", "LayerNormalization", "Clip")),
    Variant("weight_only", True, bias=False),
    Variant("zero_eps", True, eps=0.0),
    Variant("mean_is_a_delegate_output", False, mean_is_output=True),
    Variant("centered_value_read_again", False, centered_read_again=True),
    Variant("clamp_in_the_middle", False, clamp_on="eps"),
    Variant("statistics_per_channel", False, channels=3, weight_shape=(1, 8, 1, 3)),
    Variant("eps_at_run_time", False, eps_at_run_time=True),
    # A weight varying along N is no LayerNormalization scale: the norm alone fuses.
    Variant("weight_per_sample", True, weight_shape=(4, 8, 1, 1),
            ops=("Reshape", "LayerNormalization", "Mul", "Add")),
    Variant("negative_eps", False, eps=-1e-3),
]


def _layer_norm_graph(v: Variant) -> tuple[GraphBuilder, list[torch.Tensor]]:
    """x [4, 8*C] -> reshape [4, 8, 1, C] -> the decomposed norm -> outputs; its inputs."""
    g = GraphBuilder()
    n, h, c = 4, 8, v.channels
    x = g.input([n, h * c])
    inputs = [torch.randn(n, h * c) * 2 + 3]
    eps = g.input([1]) if v.eps_at_run_time else g.constant(torch.tensor(v.eps))
    if v.eps_at_run_time:
        inputs.append(torch.tensor([1e-5]))
    out = g.output([n, h, 1, c])
    extra = g.output([n, 1, 1, c]) if v.mean_is_output else None
    again = g.output([n, h, 1, c]) if v.centered_read_again else None
    full, stat = [n, h, 1, c], [n, 1, 1, c]
    a, centered, squared = g.value(full), g.value(full), g.value(full)
    mean = extra if extra is not None else g.value(stat)
    variance, shifted, inv = g.value(stat), g.value(stat), g.value(stat)
    normed = g.value(full)
    scaled = g.value(full) if v.bias else out  # without a bias the weight's product is last
    weight = g.constant(torch.randn(v.weight_shape))

    def pair(first: int, second: int, output: int) -> G.Node2x1:
        return G.Node2x1(second, first, output, 0) if v.swap else G.Node2x1(first, second,
                                                                           output, 0)
    clamp = (-0.5, 2.0)
    g.node(Kind.STATIC_RESHAPE, G.StaticReshape(4, full, x, a, 0))
    g.node(Kind.GLOBAL_AVG_POOLING_2D, G.Node1x1(a, mean, FLAG_KEEP_DIMS))
    g.node(Kind.SUBTRACT, G.Node2x1(a, mean, centered, 0))
    g.node(Kind.SQUARE, G.Node1x1(centered, squared, 0))
    g.node(Kind.GLOBAL_AVG_POOLING_2D, G.Node1x1(squared, variance, FLAG_KEEP_DIMS))
    g.node(Kind.ADD, pair(variance, eps, shifted),
           output_min_max=clamp if v.clamp_on == "eps" else None)
    g.node(Kind.RECIPROCAL_SQUARE_ROOT, G.Node1x1(shifted, inv, 0))
    g.node(Kind.MULTIPLY, pair(centered, inv, normed))
    g.node(Kind.MULTIPLY, pair(normed, weight, scaled))
    if v.bias:
        g.node(Kind.ADD, pair(scaled, g.constant(torch.randn(v.weight_shape)), out),
               output_min_max=clamp if v.clamp_on == "bias" else None)
    if again is not None:
        g.node(Kind.ABS, G.Node1x1(centered, again, 0))
    return g, inputs


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_hand_built_layer_norms(variant: Variant, onnx_ops: list[list[str]],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    g, inputs = _layer_norm_graph(variant)
    outputs, expected = run_hand_built(g, inputs, monkeypatch)
    assert_close(outputs, expected, f"{variant.name}: vs torch path")
    (ops,) = onnx_ops
    assert ("LayerNormalization" in ops) == variant.fuses, ops
    assert ("ReduceMean" in ops) != variant.fuses, ops
    if variant.ops is not None:
        assert tuple(ops) == variant.ops


class RmsNorm(nn.Module):
    """Llama's RMSNorm: a mean over the last dim (XNNPACK: a one-channel global
    average pooling), and a mean over two dims of an image as a control."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(24) + 0.5)

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return normed, image.mean((2, 3), keepdim=True)


def test_a_mean_over_the_last_dim_is_a_last_axis_reduce_mean(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime reduces [N, H, W, 1] over H, W on a slow general path; the
    # one-channel mean is emitted as a reduction over the last of two axes.
    captured: list[Any] = []
    convert = onnx_graph.to_onnx

    def keep(graph: G.XNNGraph, compiled: Any) -> onnx_graph.OnnxModel:
        made = convert(graph, compiled)
        captured.append(made.model)
        return made
    monkeypatch.setattr(onnx_graph, "to_onnx", keep)
    torch.manual_seed(0)
    compiled_against_eager(RmsNorm().eval(), [torch.randn(2, 5, 24), torch.randn(1, 3, 4, 6)],
                           monkeypatch, 1e-4, 1e-5)
    from exirc.runtime.engines.onnx_form.graph_index import inferred_shapes
    ranks = sorted(len(inferred_shapes(model)[node.input[0]]) for model in captured
                   for node in model.graph.node if node.op_type == "ReduceMean")
    assert ranks[0] == 2, ranks  # the RMSNorm's mean: [tokens, 24] over its last axis
