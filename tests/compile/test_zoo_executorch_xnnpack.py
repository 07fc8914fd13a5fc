"""ExecuTorch's own XNNPACK-lowered files for the zoo's models run on exirc's
runtime with ExecuTorch's results, and our `--target xnnpack` files delegate at
least as much of each graph as ExecuTorch's do."""

from __future__ import annotations

import functools
import operator
from typing import Any

import pytest
import torch

from tests.models.zoo import ZOO
from tests.oracle import requires_executorch

pytestmark = [requires_executorch, pytest.mark.oracle]

MODELS = ["mlp", "cnn_bn_pool", "resnet_tiny", "mobilenet_tiny", "unet_tiny", "causal_attention",
          "vit_tiny", "gpt2_lm_head", "bert"]


@functools.cache
def executorch_xnnpack(name: str) -> tuple[bytes, Any]:
    """ExecuTorch's XNNPACK file of zoo model `name`, and its lowered edge program."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = ZOO[name]
    exported = torch.export.export(model.module(), model.inputs())
    lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return lowered.to_executorch().buffer, lowered.exported_program()


def _model(name: str) -> Any:
    model = ZOO[name]
    if not model.available:
        pytest.skip(f"{name} needs {', '.join(model.requires)}")
    return model


@pytest.mark.parametrize("name", MODELS)
def test_executorch_xnnpack_file_runs_on_exirc_like_executorch(name: str, engine: str) -> None:
    from executorch.runtime import Runtime

    from tests.conftest import load_on

    model = _model(name)
    pte, _ = executorch_xnnpack(name)
    inputs = list(model.inputs())
    theirs = Runtime.get().load_program(pte).load_method("forward").execute(
        [t.clone() for t in inputs])
    ours = load_on(engine, pte).run("forward", [t.clone() for t in inputs])
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(torch.as_tensor(a), b, rtol=1e-3, atol=1e-4,
                                   msg=lambda m, i=i: f"{name} output {i} on {engine}: {m}")


def _left_on_portable(program: Any) -> int:
    return sum(1 for n in program.graph.nodes if n.op == "call_function"
               and n.target is not operator.getitem and "call_delegate" not in str(n.target))


@pytest.mark.parametrize("name", MODELS)
def test_we_leave_no_more_kernel_calls_than_executorch(name: str) -> None:
    from exirc.serialize import deserialize
    from exirc.serialize import program as P
    from tests.compile.test_zoo import compiled

    _model(name)
    pte, _ = executorch_xnnpack(name)

    def kernel_calls(data: bytes) -> int:
        plan = deserialize(data).execution_plan[0]
        return sum(isinstance(i, P.KernelCall) for c in plan.chains for i in c.instructions)

    ours, theirs = kernel_calls(compiled(name, "xnnpack").data), kernel_calls(pte)
    assert ours <= theirs, f"{name}: {ours} kernel calls left on portable, ExecuTorch {theirs}"
