"""A weight broadcast over a batch is stored once, at its own size: a bmm by
it becomes a fully connected operator on the weight, and any other use of the
broadcast runs in the delegate instead of being folded into a weight many
times bigger. The payloads run on ExecuTorch's runtime and exirc's as eager."""

from __future__ import annotations

import pytest
import torch

from exirc.serialize.xnnpack import graph as G
from tests.backend.xnnpack.harness import Lowered, eager, lower_whole, run_executorch
from tests.oracle import requires_executorch


class BatchedProjection(torch.nn.Module):
    """x [T, B, I] times a weight broadcast over the T steps, as matmul
    decomposes an RNN's input projection on a batch-first input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(48, 128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.w.expand(16, 48, 128))


class BroadcastProduct(torch.nn.Module):
    """An elementwise product with a broadcast weight: the broadcast is the
    operator's (a multiply by ones), not a 16-fold weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1, 48, 128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.w.expand(16, 48, 128) * 2.0)


def _weights(named_data: dict[str, bytes]) -> int:
    return sum(len(data) for data in named_data.values())


CASES = {
    "bmm": (BatchedProjection, (16, 2, 48)),
    "product": (BroadcastProduct, (16, 48, 128)),
}


def _lowered(name: str) -> tuple[torch.nn.Module, torch.Tensor, Lowered]:
    torch.manual_seed(0)
    make, shape = CASES[name]
    model, x = make(), torch.randn(shape)
    return model, x, lower_whole(model, (x,))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broadcast_weight_is_stored_at_its_own_size(name: str, engine: str) -> None:
    from tests.conftest import load_on

    model, x, low = _lowered(name)
    weight = model.w.nbytes
    assert weight <= _weights(low.result.named_data) <= weight + 1024
    got = load_on(engine, low.pte).run("forward", [x])
    torch.testing.assert_close(torch.as_tensor(got[0]), eager(model, (x,))[0],
                               rtol=1e-4, atol=1e-4)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broadcast_weight_runs_on_executorchs_runtime(name: str) -> None:
    model, x, low = _lowered(name)
    torch.testing.assert_close(run_executorch(low.pte, (x,))[0], eager(model, (x,))[0],
                               rtol=1e-4, atol=1e-4)


def test_a_bmm_by_a_broadcast_weight_is_a_fully_connected_operator() -> None:
    model, _, low = _lowered("bmm")
    kinds = [node.kind for node in low.blob.graph.nodes]
    assert kinds == [G.NodeKind.FULLY_CONNECTED]
    # The filter is the weight as nn.Linear would store it, [N, K], once.
    assert list(low.result.named_data.values()) == [
        model.w.detach().t().contiguous().numpy().tobytes()]
