"""Fused chains on LiteRT (XNNPACK): exirc.runtime.engines.litert.

A chain of XNNPACK delegates whose ONNX form has a TFLite form runs on one
LiteRT interpreter. Checked against eager, against the same chain on
onnxruntime and kernel by kernel, and on the layouts and paddings where a
TFLite form could go wrong (pooling padded with negative inputs, strided
convolutions whose padding is not TFLite's SAME, depthwise multipliers).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UsageError
from exirc.runtime import load
from exirc.runtime.core.method import Method
from exirc.runtime.engines.litert.chain import FUSED_ON_LITERT
from exirc.runtime.engines.onnxruntime.chain import FUSED
from tests.models.zoo import ZOO, flatten_outputs
from tests.runtime.engines.onnx_form.test_chain import kernel_by_kernel

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("ai_edge_litert")


def compiled(build: Callable[[], nn.Module], *inputs: torch.Tensor) -> tuple[bytes, nn.Module]:
    torch.manual_seed(0)
    module = build().eval()
    return compile_module(module, inputs, options=CompileOptions(target="xnnpack")).data, module


def on_litert(build: Callable[[], nn.Module], inputs: list[torch.Tensor],
              monkeypatch: pytest.MonkeyPatch) -> tuple[Method, nn.Module, bytes]:
    """The module compiled for xnnpack and loaded with its chain on LiteRT."""
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    data, module = compiled(build, *inputs)
    method = load(data).method("forward")
    assert method.execution == FUSED_ON_LITERT, method.execution
    return method, module, data


def answers_as_everyone(method: Method, module: nn.Module, inputs: list[torch.Tensor],
                        data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteRT's answers = eager's, the kernels' and onnxruntime's (within float32
    rounding: XNNPACK sums in its own order)."""
    with torch.no_grad():
        expected = flatten_outputs(module(*inputs))
    got = flatten_outputs(method.run(inputs))
    separate = flatten_outputs(kernel_by_kernel(method, inputs))
    monkeypatch.setenv("EXIRC_ENGINE", "onnxruntime")
    on_onnxruntime = load(data).method("forward")
    monkeypatch.delenv("EXIRC_ENGINE")
    assert on_onnxruntime.execution.startswith(FUSED), on_onnxruntime.execution
    other = flatten_outputs(on_onnxruntime.run(inputs))
    for ours, want, kernels, ort in zip(got, expected, separate, other, strict=True):
        assert ours.dtype == want.dtype and ours.shape == want.shape
        for reference in (want, kernels, ort):
            torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "resnet_tiny", "mobilenet_tiny", "vit_tiny", "bert",
                                  "gpt2_masked", "embedding_classifier"])
def test_zoo_models_run_on_litert_as_everywhere_else(name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = ZOO[name]
    if not model.available:
        pytest.skip(f"{name} needs {model.requires}")
    inputs = list(model.inputs())
    method, module, data = on_litert(model.module, inputs, monkeypatch)
    answers_as_everyone(method, module, inputs, data, monkeypatch)
    answers_as_everyone(method, module, [other_values(x) for x in inputs], data, monkeypatch)


def other_values(x: torch.Tensor) -> torch.Tensor:
    """A tensor like `x` of other values: random floats, or indices in x's range."""
    if x.dtype.is_floating_point:
        return torch.randn_like(x)
    if x.dtype == torch.bool:
        return torch.rand(x.shape) < 0.5
    return torch.randint(0, int(x.max()) + 1, x.shape, dtype=x.dtype)


def tflite_operators(method: Method) -> collections.Counter[str]:
    """The builtin operators of the method's LiteRT model, by name."""
    runner = method.accelerated.runner.interpreters.runner()
    return collections.Counter(op["op_name"] for op in runner.interpreter._get_ops_details())


def test_transposes_around_convolutions_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """exirc's chains wrap each convolution in NHWC<->NCHW transposes; none is left."""
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    model = ZOO["resnet_tiny"]
    data, _ = compiled(model.module, *model.inputs())
    operators = tflite_operators(load(data).method("forward"))
    assert operators["CONV_2D"] >= 4 and operators["TRANSPOSE"] <= 1, operators


class Paddings(nn.Module):
    """Max pooling padded over all-negative values (a zero pad would win the max),
    a strided convolution whose padding is not TFLite's SAME, a stride-1 one
    whose padding is, a depthwise convolution with a channel multiplier of 2,
    clamps of each kind and a hard sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.strided = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.same = nn.Conv2d(4, 4, 5, padding=2)
        self.depthwise = nn.Conv2d(4, 8, 3, padding=1, groups=4)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.pool(self.strided(x) - 100.0)
        y = self.depthwise(torch.clamp(self.same(pooled + 100.0), -0.5, 2.0))
        return pooled, nn.functional.hardsigmoid(nn.functional.relu6(y)) + torch.clamp(y, max=1.0)


def test_paddings_pools_and_clamps_match(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 3, 16, 14)
    method, module, data = on_litert(Paddings, [x], monkeypatch)
    answers_as_everyone(method, module, [x], data, monkeypatch)
    operators = tflite_operators(method)
    assert operators["DEPTHWISE_CONV_2D"] == 1 and operators["PADV2"] == 1, operators


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def test_a_node_with_no_tflite_form_stays_on_onnxruntime_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    x = torch.randn(1, 4, 8, 8)
    data, module = compiled(Grouped, x)
    method = load(data).method("forward")
    assert method.execution.startswith(FUSED), method.execution
    assert "not on LiteRT: Conv" in method.execution and "2 groups" in method.execution
    with torch.no_grad():
        torch.testing.assert_close(method.run([x])[0], module(x), rtol=1e-5, atol=1e-5)


def test_results_kept_by_the_caller_are_never_overwritten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    model = ZOO["mobilenet_tiny"]
    inputs = list(model.inputs())
    data, module = compiled(model.module, *inputs)
    method = load(data).method("forward")
    first = method.run(inputs)[0]
    kept = first.clone()
    other = [torch.randn_like(x) for x in inputs]
    second = method.run(other)[0]
    torch.testing.assert_close(first, kept, rtol=0, atol=0)
    assert not torch.equal(first, second)
    # A strided input is refused by the interpreter's copy and runs kernel by kernel.
    strided = torch.randn(inputs[0].shape[0], *inputs[0].shape[1:][::-1]).transpose(1, 3)
    assert not strided.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(method.run([strided])[0], module(strided),
                                   rtol=1e-5, atol=1e-5)


def test_each_thread_count_has_its_own_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    model = ZOO["resnet_tiny"]
    inputs = list(model.inputs())
    data, _ = compiled(model.module, *inputs)
    method = load(data).method("forward")
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = method.run(inputs)[0].clone()
        torch.set_num_threads(2)
        two = method.run(inputs)[0].clone()
    finally:
        torch.set_num_threads(saved)
    runners = method.accelerated.runner.interpreters._runners
    assert set(runners) >= {1, 2} and runners[1].threads == 1
    assert runners[2].threads in (1, 2)  # the faster, timed at load
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-6)


def test_a_model_too_slow_to_time_gets_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    monkeypatch.setattr("exirc.runtime.engines.litert.interpreter._MEASURED_UP_TO", 0.0)
    model = ZOO["mlp"]
    data, _ = compiled(model.module, *model.inputs())
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        method = load(data).method("forward")
    finally:
        torch.set_num_threads(saved)
    assert method.accelerated.runner.interpreters._runners[2].threads == 2


@pytest.mark.parametrize("by", ["argument", "environment"])
def test_the_engine_is_chosen_by_load_or_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                       by: str) -> None:
    model = ZOO["mlp"]
    data, _ = compiled(model.module, *model.inputs())

    def method(engine: str | None) -> Method:
        if by == "environment" and engine is not None:
            monkeypatch.setenv("EXIRC_ENGINE", engine)
            return load(data).method("forward")
        monkeypatch.delenv("EXIRC_ENGINE", raising=False)
        return load(data, engine=engine).method("forward")

    on_onnxruntime = method("onnxruntime")
    assert (on_onnxruntime.engine, on_onnxruntime.execution) == ("onnxruntime", FUSED)
    assert method("litert").execution == FUSED_ON_LITERT
    assert method("reference").engine == "reference"
    monkeypatch.setattr("exirc.runtime.engines.litert.engine.litert_available", lambda: False)
    with pytest.raises(UsageError, match="ai-edge-litert is not installed"):
        method("litert")
    assert method(None).execution == f"{FUSED} (not on LiteRT: ai-edge-litert is not installed)"


class ZeroDims(nn.Module):
    """A 0-d input and a 0-d output (LiteRT's binding reads a 0-d tensor out as a
    scalar, not a view of its memory: they are [1] in the file), and any/all."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, scale: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.linear(x) * scale
        return y, torch.any(y > 1.0), torch.all(y > -1.0, dim=-1)


def test_zero_dim_inputs_and_outputs_are_copied_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    x, scale = torch.randn(3, 6), torch.tensor(2.0)
    method, module, data = on_litert(ZeroDims, [x, scale], monkeypatch)
    for value in (0.0, 2.0, -5.0, 100.0):
        answers_as_everyone(method, module, [x, torch.tensor(value)], data, monkeypatch)


class Pools(nn.Module):
    """Average pools LiteRT divides as torch does (no padding; padding torch does
    not count, equal to TFLite's SAME), leaky ReLU, PReLU, and a broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.plain = nn.AvgPool2d(2)
        self.same = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.prelu = nn.PReLU(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.leaky_relu(self.conv(x), 0.2)
        return self.prelu(self.same(self.plain(y))) + torch.ones(4, 1, 1).expand(4, 5, 6)


def test_pools_and_leaky_activations_match(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 3, 10, 12)
    method, module, data = on_litert(Pools, [x], monkeypatch)
    answers_as_everyone(method, module, [x], data, monkeypatch)
    assert tflite_operators(method)["AVERAGE_POOL_2D"] == 2


class CountedPadding(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.avg_pool2d(torch.relu(x), 3, stride=1, padding=1)


def test_an_average_pool_counting_its_padding_stays_on_onnxruntime(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TFLite divides by the elements inside the input; torch, by default, by all."""
    monkeypatch.delenv("EXIRC_ENGINE", raising=False)
    x = torch.randn(1, 2, 6, 6)
    data, module = compiled(CountedPadding, x)
    method = load(data).method("forward")
    if method.accelerated is None:
        pytest.skip(f"not fused at all: {method.execution}")
    assert "not on LiteRT" in method.execution, method.execution
    with torch.no_grad():
        torch.testing.assert_close(method.run([x])[0], module(x), rtol=1e-5, atol=1e-6)


class LastColumn(nn.Module):
    """x[..., -1] and x[:, -2]: positions counted from the end (ONNX slices of
    negative starts, which the TFLite form clamps as ONNX does)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        return y[..., -1] * 2.0, y[:, -2] + 1.0


def test_positions_from_the_end_pick_from_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, 4, 6)
    method, module, data = on_litert(LastColumn, [x], monkeypatch)
    answers_as_everyone(method, module, [x], data, monkeypatch)
