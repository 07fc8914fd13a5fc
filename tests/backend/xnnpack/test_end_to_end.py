"""Each model of the zoo as one partition: XnnpackBackend's payload runs on
ExecuTorch's own runtime (and on exirc's) and agrees with eager PyTorch,
with no more transposes than ExecuTorch's lowering of the same model."""

from __future__ import annotations

import hashlib

import pytest
import torch

from exirc.serialize.xnnpack import graph as G
from tests.backend.xnnpack.harness import Lowered, eager, lower_whole, run_executorch, transposes
from tests.backend.xnnpack.models import CASES

RTOL, ATOL = 1e-3, 1e-4

# What XnnpackBackend makes of each model: (XNNPACK nodes, of which transposes).
# A change here is a change of the payloads: update it when intended.
OURS = {
    "mlp": (2, 0), "conv_bn_relu": (3, 2), "mobilenet_block": (4, 2), "conv_transpose": (4, 2),
    "pools": (13, 5), "data_movement": (8, 3), "upsample": (10, 4), "attention": (23, 4),
    "broadcasting": (16, 4), "residual_head": (7, 1), "unet": (11, 2), "norms": (45, 2),
    "prelu_hardswish": (5, 2),
}

_lowered: dict[str, tuple[Lowered, tuple[torch.Tensor, ...]]] = {}


def lowered(name: str) -> tuple[Lowered, tuple[torch.Tensor, ...]]:
    if name not in _lowered:
        torch.manual_seed(0)
        case = CASES[name]
        model, inputs = case.make(), case.inputs()
        _lowered[name] = (lower_whole(model, inputs), inputs)
        _models[name] = model
    return _lowered[name]


_models: dict[str, torch.nn.Module] = {}


def _check(outputs: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_on_executorchs_runtime(name: str) -> None:
    pytest.importorskip("executorch.runtime")
    low, inputs = lowered(name)
    _check(run_executorch(low.pte, inputs), eager(_models[name], inputs))


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_on_exircs_runtime(name: str, engine: str) -> None:
    from tests.conftest import load_on

    low, inputs = lowered(name)
    outputs = load_on(engine, low.pte).run("forward", list(inputs))
    _check([torch.as_tensor(o) for o in outputs], eager(_models[name], inputs))


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_more_transposes_than_executorch(name: str) -> None:
    low, _ = lowered(name)
    reference = CASES[name].executorch
    count = (len(low.blob.graph.nodes), transposes(low.blob))
    assert count == OURS[name]
    # Where ExecuTorch leaves nodes out, its payloads do less work (a softmax
    # over dim 1, say, costs a transpose each way) and are not comparable.
    if reference.delegated_all:
        assert count[0] <= reference.nodes
        assert count[1] <= reference.transposes


def test_externals_are_numbered_inputs_then_outputs() -> None:
    low, _ = lowered("broadcasting")
    graph = low.blob.graph
    values = {v.id_out: v for v in graph.values}
    assert [values[i].external_id for i in graph.input_ids] == [0, 1, 2]
    assert [values[i].external_id for i in graph.output_ids] == [3, 4, 5]
    assert all(values[i].flags == G.FLAG_EXTERNAL_INPUT for i in graph.input_ids)
    assert all(values[i].flags == G.FLAG_EXTERNAL_OUTPUT for i in graph.output_ids)
    assert graph.num_externs == 6
    # External values are in PyTorch's layout, whatever the graph uses inside.
    assert values[graph.input_ids[0]].dims == [1, 4, 5, 5]


def test_weights_are_named_data_keyed_by_their_sha256() -> None:
    low, _ = lowered("mobilenet_block")
    result, graph = low.result, low.blob.graph
    assert result.named_data
    for key, data in result.named_data.items():
        assert hashlib.sha256(data).hexdigest() == key
    named = {entry.named_key: entry for entry in graph.constant_data[1:]}
    assert set(named) == set(result.named_data)
    assert all(e.offset == G.NAMED_DATA_OFFSET and e.size == len(result.named_data[k])
               for k, e in named.items())
    assert result.summary is not None
    assert result.summary.weight_bytes == sum(len(d) for d in result.named_data.values())
    assert result.summary.op_kinds == {"STATIC_TRANSPOSE": 2, "DEPTHWISE_CONV2D": 1, "CONV2D": 1}
    # Both batch norms folded, both relu6 fused into the convolutions.
    convs = [n for n in graph.nodes if n.kind != G.NodeKind.STATIC_TRANSPOSE]
    assert [n.output_min_max for n in convs] == [(0.0, 6.0), (0.0, 6.0)]
