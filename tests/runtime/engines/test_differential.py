"""Each engine against the reference interpreter, on the same file and inputs.

The reference (exirc's interpreter, XNNPACK payloads on its own executor) is
what `--verify` checks against eager PyTorch. An engine must give its answers
within its documented tolerance (`TOLERANCE`: onnxruntime and LiteRT sum in
another order than torch's kernels; docs/running.md says so): on the bench
zoo's programs as exirc lowers them, on ExecuTorch's own XNNPACK files of the
same models, and on random programs.
"""

from __future__ import annotations

import functools
import importlib.util
import random
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from tests.models.zoo import ZOO, flatten_outputs
from tests.oracle import requires_executorch

BENCH_ZOO = ["mlp", "resnet_tiny", "mobilenet_tiny", "vit_tiny", "gpt2_lm_head", "bert",
             "lstm_tagger"]
TOLERANCE = {"onnxruntime": (1e-4, 1e-5), "litert": (1e-4, 1e-5)}  # rtol, atol
ENGINES = [pytest.param(name, marks=pytest.mark.skipif(
    importlib.util.find_spec(package) is None, reason=f"needs {package} installed"))
    for name, package in (("onnxruntime", "onnxruntime"), ("litert", "ai_edge_litert"))]


def _agree(data: bytes, inputs: Sequence[torch.Tensor], engine: str, what: str) -> None:
    """`engine`'s outputs for `inputs` equal the reference's within its tolerance, and
    it ran at least one delegate or the whole method (else it checked nothing)."""
    reference = load(data, engine="reference").method("forward")
    method = load(data, engine=engine).method("forward")
    if engine == "litert" and method.engine != "litert":
        pytest.skip(f"{what}: LiteRT does not take it ({method.execution}); onnxruntime's "
                    "run of it is checked on its own")
    assert method.engine == engine or any(
        e.startswith(engine) for e in method.delegate_engines), (what, method.execution)
    want = flatten_outputs(reference.run([t.clone() for t in inputs]))
    got = flatten_outputs(method.run([t.clone() for t in inputs]))
    rtol, atol = TOLERANCE[engine]
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=f"{what}: output {i}")


@functools.cache
def _exirc_file(name: str) -> bytes:
    model = ZOO[name]
    return compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack")).data


@functools.cache
def _executorch_file(name: str) -> bytes:
    from tests.runtime.delegates.xnnpack.zoo import ZooModel as XnnpackZooModel
    from tests.runtime.delegates.xnnpack.zoo import executorch_xnnpack_pte

    model = ZOO[name]
    return executorch_xnnpack_pte(XnnpackZooModel(name, model.module, model.inputs))


def _available(name: str) -> None:
    if not ZOO[name].available:
        pytest.skip(f"{name} needs {ZOO[name].requires}")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", BENCH_ZOO)
def test_engine_equals_the_reference_on_exirc_files(name: str, engine: str) -> None:
    _available(name)
    inputs = ZOO[name].inputs()
    _agree(_exirc_file(name), inputs, engine, f"{name} (exirc) on {engine}")


@requires_executorch
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["mlp", "resnet_tiny", "vit_tiny", "bert", "lstm_tagger"])
def test_engine_equals_the_reference_on_executorch_files(name: str, engine: str) -> None:
    _available(name)
    _agree(_executorch_file(name), ZOO[name].inputs(), engine,
           f"{name} (ExecuTorch's file) on {engine}")


class RandomNet(nn.Module):
    """A random stack of layers engines translate: linear, conv-free elementwise math,
    norms, softmax, residual adds; seeded, so each seed is one program."""

    LAYERS = ("linear", "relu", "tanh", "sigmoid", "gelu", "layer_norm", "softmax",
              "residual", "hardswish", "mul_self")

    def __init__(self, seed: int, width: int = 12) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.kinds = [rng.choice(self.LAYERS) for _ in range(rng.randint(3, 9))]
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in self.kinds)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in self.kinds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for kind, linear, norm in zip(self.kinds, self.linears, self.norms):
            if kind == "linear":
                x = linear(x)
            elif kind == "layer_norm":
                x = norm(x)
            elif kind == "softmax":
                x = torch.softmax(x, dim=-1)
            elif kind == "residual":
                x = x + linear(x)
            elif kind == "mul_self":
                x = x * torch.sigmoid(x)
            else:
                x = getattr(torch.nn.functional, kind)(x)
        return x


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(8))
def test_engine_equals_the_reference_on_random_programs(seed: int, engine: str) -> None:
    data, x, kinds = _random_program(seed)
    _agree(data, [x], engine, f"random program {seed} {kinds} on {engine}")


@functools.cache
def _random_program(seed: int) -> tuple[bytes, torch.Tensor, list[str]]:
    """Random program `seed` compiled for XNNPACK, its input and its layers' kinds:
    made once for every engine's test."""
    torch.manual_seed(seed)
    model = RandomNet(seed).eval()
    x = torch.randn(3, 12)
    return bytes(compile_module(model, (x,), options=CompileOptions(target="xnnpack")).data), \
        x, list(model.kinds)


def test_an_output_planned_in_other_dims_than_its_delegate_writes_is_not_fused() -> None:
    """Found by the mutation campaign's engine runs: a file whose output is planned
    [3, 4] while its delegate writes [1, 3, 4]. The reference resizes the output to
    the delegate's dims; a fused chain would have reshaped it to the plan's. Such a
    chain is refused, and every engine answers as the reference does."""
    from exirc.serialize import deserialize, serialize

    module = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.randn(1, 3, 4)
    program = deserialize(compile_module(module, (x,),
                                         options=CompileOptions(target="xnnpack")).data)
    plan = program.execution_plan[0]
    output = plan.values[plan.outputs[0]]
    assert output.sizes == [1, 3, 4]
    output.sizes, output.dim_order = [3, 4], [0, 1]
    data = serialize(program)
    want = load(data, engine="reference").run("forward", [x])[0]
    assert want.shape == (1, 3, 4)
    for engine in ("auto", "onnxruntime"):
        if importlib.util.find_spec("onnxruntime") is None:
            pytest.skip("needs onnxruntime installed")
        method = load(data, engine=engine).method("forward")
        assert method.accelerated is None and "the delegate's (1, 3, 4)" in method.execution
        got = method.run([x])[0]
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=TOLERANCE["onnxruntime"][0],
                                   atol=TOLERANCE["onnxruntime"][1])
