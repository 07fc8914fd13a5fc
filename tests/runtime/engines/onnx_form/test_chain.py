"""A method's whole chain as one onnxruntime session (exirc.runtime.engines.onnx_form.chain):
the same answers as the kernel-by-kernel run and eager PyTorch; the errors of
the kernel-by-kernel run for indices a session would wrap or refuse; no fused
chain where one cannot be exact (an untranslatable kernel, program state, the
torch engine), and such methods still run as before."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.core.method import Method
from tests.models.zoo import ZOO, flatten_outputs

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

FUSED = ["vit_tiny", "bert", "gpt2_masked", "embedding_classifier", "causal_attention"]
"""Zoo models whose xnnpack programs have kernels between or before their
delegates: attention's safe-softmax guard (eq, logical_not, any, where), BERT's
and GPT-2's masks (_to_copy, index, bitwise_and, where), embedding lookups."""


@functools.cache
def xnnpack_program(name: str) -> bytes:
    model = ZOO[name]
    return compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack")).data


def forward(name: str, engine: str | None = None) -> Method:
    return load(xnnpack_program(name), engine=engine).method("forward")


def kernel_by_kernel(method: Method, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The run without the fused session: an observed run takes the instructions one by one."""
    return method.run(inputs, observer=lambda chain, index: None)


@pytest.mark.parametrize("name", FUSED)
def test_the_fused_chain_answers_as_the_kernels_and_eager_do(name: str) -> None:
    model = ZOO[name]
    if not model.available:
        pytest.skip(f"{name} needs {model.requires}")
    method = forward(name)
    assert method.accelerated is not None, "the chain was expected to fuse"
    inputs = list(model.inputs())
    fused = flatten_outputs(method.run(inputs))
    again = flatten_outputs(method.run(inputs))  # the reused binding
    separate = flatten_outputs(kernel_by_kernel(method, inputs))
    expected = model.reference_outputs()
    assert len(fused) == len(separate) == len(expected)
    for got, second, other, want in zip(fused, again, separate, expected):
        torch.testing.assert_close(got, second, rtol=0, atol=0)
        torch.testing.assert_close(got, other, rtol=model.rtol, atol=model.atol)
        torch.testing.assert_close(got, want, rtol=model.rtol, atol=model.atol)


def test_outputs_survive_the_next_run_and_new_inputs_are_read() -> None:
    model = ZOO["vit_tiny"]
    method = forward("vit_tiny")
    first_inputs = list(model.inputs())
    first = method.run(first_inputs)[0]
    kept = first.clone()
    other = [torch.randn_like(first_inputs[0])]
    second = method.run(other)[0]
    torch.testing.assert_close(first, kept, rtol=0, atol=0)
    assert not torch.equal(first, second)
    with torch.no_grad():
        torch.testing.assert_close(second, model.module()(*other), rtol=model.rtol,
                                   atol=model.atol)


@pytest.mark.usefixtures("chains_on_onnxruntime")
def test_a_change_of_thread_count_makes_a_session_for_it() -> None:
    model = ZOO["bert"]
    if not model.available:
        pytest.skip("bert needs transformers")
    method, inputs = forward("bert"), list(model.inputs())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = flatten_outputs(method.run(inputs))
        torch.set_num_threads(1)
        one = flatten_outputs(method.run(inputs))
    finally:
        torch.set_num_threads(before)
    assert method.accelerated is not None and len(method.accelerated.runner._sessions) >= 2
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def fails_as_the_kernels_do(method: Method, inputs: list[torch.Tensor]) -> Exception:
    """The error the method raises on `inputs`, checked to be the kernel-by-kernel run's."""
    with pytest.raises(Exception) as fused_error:
        method.run(inputs)
    with pytest.raises(Exception) as kernel_error:
        kernel_by_kernel(method, inputs)
    assert type(fused_error.value) is type(kernel_error.value)
    assert str(fused_error.value) == str(kernel_error.value)
    return fused_error.value


class BoolReductions(nn.Module):
    """A linear (delegated) whose rows of -inf inputs are zeroed, and any/all in
    each of their forms (over a dim, kept or not, of a negation, over everything)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        masked = x == float("-inf")
        rows = torch.any(masked, dim=-1, keepdim=True)
        return (torch.where(rows, torch.zeros_like(x), self.linear(x)),
                torch.all(torch.logical_not(masked), dim=1), torch.any(masked),
                torch.all(masked, dim=-1))


def test_any_and_all_run_fused_on_the_bools_with_the_kernels_answers() -> None:
    torch.manual_seed(0)
    model = BoolReductions().eval()
    example = torch.randn(2, 3, 6)
    method = load(compile_module(model, [example], options=CompileOptions(
        target="xnnpack")).data).method("forward")
    assert method.accelerated is not None
    ops = [node.op_type for node in onnx.load_from_string(method.accelerated.form.model).graph.node]
    assert "Cast" not in ops, ops  # reduced over the bools, not over a widened copy
    inf_rows = example.clone()
    inf_rows[0, 1] = float("-inf")
    for x in (example, inf_rows, torch.full((2, 3, 6), float("-inf"))):
        fused = method.run([x])
        with torch.no_grad():
            expected = model(x)
        for got, other, want in zip(fused, kernel_by_kernel(method, [x]), expected):
            torch.testing.assert_close(got, other, rtol=1e-5, atol=1e-6, equal_nan=True)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


# Each fused engine: onnxruntime's Gather wraps -1, LiteRT's refuses the call.
ENGINES = pytest.mark.parametrize("engine", ["onnxruntime", "litert"])


def forward_on(name: str, engine: str, monkeypatch: pytest.MonkeyPatch) -> Method:
    """The program's forward with its chain fused on `engine`."""
    if engine == "litert":
        pytest.importorskip("ai_edge_litert")
    method = forward(name, engine)
    assert method.engine == engine, method.execution
    return method


@ENGINES
@pytest.mark.parametrize("bad_id", [-1, 10_000], ids=["negative", "past_the_end"])
def test_an_index_the_session_would_wrap_or_refuse_fails_as_the_kernel_does(
        bad_id: int, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # ONNX Gather wraps -1 to the last row; torch's embedding raises. The fused
    # run must not answer: it falls back and the kernel's located error is raised.
    model = ZOO["embedding_classifier"]
    method = forward_on("embedding_classifier", engine, monkeypatch)
    inputs = [t.clone() for t in model.inputs()]
    inputs[0].view(-1)[1] = bad_id
    fused_error = fails_as_the_kernels_do(method, inputs)
    assert "embedding" in str(fused_error)
    good = list(model.inputs())  # and the method still answers right afterwards
    torch.testing.assert_close(flatten_outputs(method.run(good)), model.reference_outputs(),
                               rtol=model.rtol, atol=model.atol)


@ENGINES
@pytest.mark.parametrize("position", [0, 1], ids=["input_ids", "token_type_ids"])
def test_a_negative_index_into_either_of_two_embeddings_fails_as_the_kernel_does(
        position: int, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # BERT's chain reads two index inputs: the least index over both guards the run.
    model = ZOO["bert"]
    if not model.available:
        pytest.skip("bert needs transformers")
    method = forward_on("bert", engine, monkeypatch)
    assert method.accelerated is not None and method.accelerated.form.floor is not None
    inputs = [t.clone() for t in model.inputs()]
    inputs[position].view(-1)[3] = -1
    fails_as_the_kernels_do(method, inputs)
    torch.testing.assert_close(flatten_outputs(method.run(list(model.inputs()))),
                               model.reference_outputs(), rtol=model.rtol, atol=model.atol)


class CumulativeHead(nn.Module):
    """A linear (delegated) and a cumsum, which no translator takes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.linear(x), dim=-1)


def test_a_kernel_without_an_onnx_form_keeps_the_chain_kernel_by_kernel() -> None:
    module, x = CumulativeHead().eval(), torch.randn(2, 8)
    data = compile_module(module, (x,), options=CompileOptions(target="xnnpack")).data
    method = load(data).method("forward")
    assert method.accelerated is None
    with torch.no_grad():
        torch.testing.assert_close(method.run([x])[0], module(x), rtol=1e-5, atol=1e-6)


def test_the_reference_engine_fuses_nothing() -> None:
    model = ZOO["vit_tiny"]
    method = forward("vit_tiny", "reference")
    assert method.accelerated is None and method.engine == "reference"
    assert method.delegate_engines == ["reference"] * len(method.delegate_engines)
    torch.testing.assert_close(method.run(list(model.inputs()))[0],
                               model.reference_outputs()[0], rtol=model.rtol, atol=model.atol)


def test_a_profiled_run_times_the_engine_plain_runs_use() -> None:
    from exirc.runtime.core.profile import Profile

    inputs = list(ZOO["vit_tiny"].inputs())
    method = forward("vit_tiny")
    profile = Profile()
    profiled = method.run(inputs, profile=profile)
    assert [row["op"] for row in profile.rows()] == [method.execution]
    assert profile.instruction_rows() == []  # the engine's call is not an instruction
    for got, want in zip(flatten_outputs(profiled), flatten_outputs(method.run(inputs))):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # On the reference every instruction is timed.
    reference, profile = forward("vit_tiny", "reference"), Profile()
    reference.run(inputs, profile=profile)
    labels = " ".join(str(row) for row in profile.rows())
    assert "any" in labels and "where" in labels and "delegate" in labels.lower()


class SquareHead(nn.Module):
    """Two delegated linears on a square input, which it also returns as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.body(x), x


def test_inputs_are_read_where_the_caller_has_them_whatever_it_does_to_them() -> None:
    # The session reads the caller's memory (no copy into the plan): a change in
    # place, a new tensor, a numpy array and strides changed in place must each
    # be seen, the last by running kernel by kernel (ONNX reads rows as laid out).
    module = SquareHead().eval()
    x = torch.randn(4, 4)
    data = compile_module(module, (x,), options=CompileOptions(target="xnnpack")).data
    method = load(data).method("forward")
    assert method.accelerated is not None

    def check(given: object, expected_input: torch.Tensor) -> None:
        outputs = method.run([given])
        with torch.no_grad():
            want = module(expected_input)
        torch.testing.assert_close(outputs[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outputs[1], expected_input, rtol=0, atol=0)

    check(x, x.clone())
    x.mul_(-2)  # same memory, new values
    check(x, x.clone())
    y = torch.randn(4, 4)
    check(y, y.clone())
    check(y.numpy(), y.clone())
    check(x, x.clone())
    x.t_()  # the address just bound, now column-major
    assert not x.is_contiguous()
    check(x, x.contiguous())
    returned = method.run([y])[1]
    returned.add_(1)  # an output is the method's own copy, never the caller's tensor
    assert not torch.equal(returned, y)


def test_a_translator_failing_unforeseen_leaves_the_method_kernel_by_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A chain no translator foresaw (a hostile file's, say) must not fail the load
    # with a raw exception: the kernels, which check every argument, run it.
    from exirc.runtime.engines.onnx_form import chain as onnx_chain

    def unforeseen(e: object, args: list[int]) -> None:
        raise ValueError("a shape no translator expected")
    monkeypatch.setitem(onnx_chain._TRANSLATORS, "aten::embedding.out", unforeseen)
    model = ZOO["embedding_classifier"]
    method = forward("embedding_classifier")
    assert method.accelerated is None
    assert method.execution == ("instruction by instruction (not fused: building it failed: "
                                "ValueError: a shape no translator expected)")
    torch.testing.assert_close(flatten_outputs(method.run(list(model.inputs()))),
                               model.reference_outputs(), rtol=model.rtol, atol=model.atol)
