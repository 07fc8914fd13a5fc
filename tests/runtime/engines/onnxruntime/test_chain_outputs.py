"""A fused chain hands its outputs out without copying them: the caller gets a
view of the chain's output memory, which the next run writes again only if
nothing but the chain references it any more (exirc.runtime.engines.onnx_form
.chain_form). Both engines that run chains are checked: onnxruntime binds that
memory and writes it in place, LiteRT copies its results into it.

Whatever the caller keeps (the result, a slice, a numpy array, the storage, a
DLPack capsule) keeps its values through later runs; whatever it does to a
result it dropped (moved or shrank its storage) cannot make a later run write
where it should not."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.core.method import Method

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(6, 5), nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.first(x))
        return hidden, self.second(hidden)


@functools.cache
def model_and_program() -> tuple[nn.Module, bytes]:
    torch.manual_seed(0)
    model = TwoOutputs().eval()
    data = compile_module(model, [torch.randn(3, 6)],
                          options=CompileOptions(target="xnnpack")).data
    return model, data


Fused = Callable[[], Method]


@pytest.fixture(params=["onnxruntime", pytest.param("litert", marks=pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None, reason="needs ai-edge-litert"))])
def fused_method(request: pytest.FixtureRequest) -> Fused:
    """A fresh load of the program, its chain fused on the engine the test checks."""
    def fused() -> Method:
        method = load(model_and_program()[1], engine=request.param).method("forward")
        assert method.engine == request.param, method.execution
        return method
    return fused


def eager(x: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model_and_program()[0](x))


def assert_answers(results: list[torch.Tensor], x: torch.Tensor) -> None:
    for got, want in zip(results, eager(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


HOLDS: dict[str, Callable[[torch.Tensor], Any]] = {
    "the result": lambda result: result,
    "a slice": lambda result: result[1:],
    "a numpy array": lambda result: result.numpy(),
    "its storage": lambda result: result.untyped_storage(),
    "a DLPack capsule": lambda result: torch.utils.dlpack.to_dlpack(result),
}


def held_values(hold: Any) -> torch.Tensor:
    """What a hold of a [3, 5] result reads now."""
    if isinstance(hold, torch.Tensor):
        return hold.reshape(-1)[-10:].clone()  # the last two rows either way
    if isinstance(hold, torch.UntypedStorage):
        return torch.empty(0).set_(hold).view(torch.float32)[-10:].clone()
    if type(hold).__name__ == "PyCapsule":
        return torch.utils.dlpack.from_dlpack(hold).reshape(-1)[-10:].clone()
    return torch.from_numpy(hold).reshape(-1)[-10:].clone()


@pytest.mark.parametrize("kind", HOLDS)
def test_whatever_the_caller_holds_keeps_its_values_through_later_runs(
        kind: str, fused_method: Fused) -> None:
    method = fused_method()
    x = torch.randn(3, 6)
    hidden, _ = method.run([x])
    hold, want = HOLDS[kind](hidden), hidden.reshape(-1)[-10:].clone()
    del hidden
    for _ in range(3):
        y = torch.randn(3, 6)
        assert_answers(method.run([y]), y)
    assert torch.equal(held_values(hold), want)


def test_a_dropped_result_is_written_again_in_place_and_a_kept_one_never(
        fused_method: Fused) -> None:
    method = fused_method()
    x = torch.randn(3, 6)
    first = method.run([x])
    address = first[1].data_ptr()
    del first
    second = method.run([x + 1])
    assert second[1].data_ptr() == address, "the memory of a dropped result is reused"
    kept = [t.clone() for t in second]
    third = method.run([x - 1])
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(second, third))
    assert all(torch.equal(a, b) for a, b in zip(second, kept))
    assert_answers(second, x + 1)
    assert_answers(third, x - 1)


def test_a_result_changed_in_place_by_the_caller_is_not_the_next_answer(
        fused_method: Fused) -> None:
    method = fused_method()
    x = torch.randn(3, 6)
    first = method.run([x])
    first[0].add_(100.0)
    first[1].resize_(2)  # its own view; the storage keeps its size
    del first
    assert_answers(method.run([x]), x)


@pytest.mark.parametrize("change", ["shrunk", "moved to shared memory", "grown"])
def test_a_dropped_result_whose_storage_changed_is_not_written(
        change: str, fused_method: Fused) -> None:
    method = fused_method()
    x = torch.randn(3, 6)
    hidden, _ = method.run([x])
    storage = hidden.untyped_storage()
    if change == "shrunk":
        storage.resize_(0)
    elif change == "grown":
        storage.resize_(storage.nbytes() * 4)
    else:
        hidden.share_memory_()
    del hidden, storage
    for _ in range(2):
        y = torch.randn(3, 6)
        assert_answers(method.run([y]), y)


def test_the_callers_input_is_left_as_it_was_resizable(fused_method: Fused) -> None:
    # Binding through numpy would have made its storage unresizable for good.
    method = fused_method()
    x = torch.randn(3, 6)
    assert_answers(method.run([x]), x)
    x.resize_(10, 6)
    x.untyped_storage().resize_(0)
