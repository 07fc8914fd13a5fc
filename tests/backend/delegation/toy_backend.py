"""A toy delegation backend for testing the framework without XNNPACK.

It takes float `add`/`mul`/`relu` nodes; its payload is JSON: the ops in
order, each reading earlier values by index (0.. inputs, then results), and
the indices of the outputs. `ToyRuntime` executes that payload in exirc's
runtime. Weights go to named data, keyed by their sha256.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import torch
from torch.fx import Node

from exirc.backend.delegation.capability import CapabilityPartitioner
from exirc.backend.delegation.interface import (
    DelegateSummary,
    PartitionGraph,
    PreprocessResult,
    Rejection,
)

BACKEND_ID = "ToyBackend"
OPS = {torch.ops.aten.add.Tensor: "add", torch.ops.aten.mul.Tensor: "mul",
       torch.ops.aten.relu.default: "relu"}


class ToySupport:
    backend_id = BACKEND_ID

    def check(self, node: Node, program: Any) -> Rejection | None:
        if node.target not in OPS:
            return Rejection(node, "op", "the toy backend runs add, mul and relu only")
        if node.meta["val"].dtype != torch.float32:
            return Rejection(node, "dtype", "float32 only")
        return None


class ToyBackend:
    backend_id = BACKEND_ID

    def preprocess(self, partition: PartitionGraph) -> PreprocessResult:
        index: dict[Node, int] = {}
        weights: dict[str, bytes] = {}
        constants: list[list[Any]] = []
        for p in partition.runtime_inputs:
            index[p] = len(index)
        for p in partition.placeholders:
            if p.target in partition.constants:
                data = partition.constants[p.target].contiguous().numpy().tobytes()
                key = hashlib.sha256(data).hexdigest()
                weights[key] = data
                index[p] = len(index)
                constants.append([key, list(partition.constants[p.target].shape)])
        ops = []
        for node in partition.graph_module.graph.nodes:
            if node.op == "call_function":
                ops.append([OPS[node.target], [index[a] for a in node.args]])
                index[node] = len(index)
        payload = {"inputs": len(partition.runtime_inputs), "constants": constants, "ops": ops,
                   "outputs": [index[o] for o in partition.outputs]}
        return PreprocessResult(json.dumps(payload).encode(), [("toy", b"1")], weights,
                                DelegateSummary(len(ops), {}, sum(map(len, weights.values()))))


class ToyPartitioner(CapabilityPartitioner):
    backends = {BACKEND_ID: ToyBackend()}

    def __init__(self) -> None:
        super().__init__(ToySupport())


class ToyRuntime:
    """exirc runtime side: executes the JSON payload."""

    def init(self, processed: Any, compile_specs: Any, context: Any) -> dict[str, Any]:
        payload = json.loads(bytes(processed))
        payload["weights"] = [
            torch.from_numpy(np.frombuffer(bytes(context.named_data(key)),
                                           dtype=np.float32).copy()).reshape(shape)
            for key, shape in payload["constants"]]
        return payload

    def execute(self, handle: dict[str, Any], args: list[Any]) -> None:
        n = handle["inputs"]
        values = list(args[:n]) + handle["weights"]
        for op, operands in handle["ops"]:
            x = [values[i] for i in operands]
            values.append(x[0] + x[1] if op == "add" else x[0] * x[1] if op == "mul"
                          else torch.relu(x[0]))
        for out, i in zip(args[n:], handle["outputs"]):
            out.resize_(values[i].shape).copy_(values[i])
