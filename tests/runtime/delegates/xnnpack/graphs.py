"""Building XNNPACK graphs by hand, for tests: values, constants, nodes, and a runner.

    g = GraphBuilder()
    x = g.input([1, 4, 4, 3])
    w = g.constant(torch.randn(8, 3, 3, 3))
    y = g.output([1, 4, 4, 8])
    g.node(NodeKind.CONV2D, Conv(...))
    outputs = g.run(torch.randn(1, 4, 4, 3))

External ids follow ExecuTorch: inputs first, in the order they were
declared, then outputs. Constants go to the blob's constant region, or to
named data with `named=True`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from exirc.runtime.delegates.xnnpack.backend import XnnpackBackend
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.serialize.xnnpack import graph as G

DTYPES = {torch.float32: G.Datatype.FP32, torch.float16: G.Datatype.FP16,
          torch.int32: G.Datatype.INT32, torch.int8: G.Datatype.QINT8}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


class NamedContext:
    """A stand-in for BackendInitContext: named data from a dict."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data
        self.where = "test"

    def named_data(self, key: str) -> bytes | memoryview | None:
        value = self.data.get(key)
        return None if value is None else memoryview(bytearray(value))


class GraphBuilder:
    def __init__(self) -> None:
        self.graph = G.XNNGraph()
        self.region = bytearray()
        self.named: dict[str, bytes] = {}
        self._inputs: list[int] = []
        self._outputs: list[int] = []

    def _value(self, dims: Sequence[int], datatype: G.Datatype = G.Datatype.FP32,
               **fields: Any) -> int:
        value_id = len(self.graph.values)
        self.graph.values.append(G.TensorValue(datatype, list(dims), value_id, **fields))
        return value_id

    def input(self, dims: Sequence[int], datatype: G.Datatype = G.Datatype.FP32) -> int:
        value_id = self._value(dims, datatype, flags=G.FLAG_EXTERNAL_INPUT)
        self._inputs.append(value_id)
        return value_id

    def output(self, dims: Sequence[int], datatype: G.Datatype = G.Datatype.FP32) -> int:
        value_id = self._value(dims, datatype, flags=G.FLAG_EXTERNAL_OUTPUT)
        self._outputs.append(value_id)
        return value_id

    def value(self, dims: Sequence[int], datatype: G.Datatype = G.Datatype.FP32) -> int:
        return self._value(dims, datatype)

    def constant(self, tensor: torch.Tensor, *, named: bool = False,
                 datatype: G.Datatype | None = None) -> int:
        data = tensor.contiguous().numpy().tobytes()
        if named:
            key = hashlib.sha256(data).hexdigest()
            self.named[key] = data
            entry = G.ConstantDataOffset(G.NAMED_DATA_OFFSET, len(data), key)
        else:
            self.region += bytes(-len(self.region) % 16)
            entry = G.ConstantDataOffset(len(self.region), len(data))
            self.region += data
        self.graph.constant_data.append(entry)
        return self._value(list(tensor.shape) or [1], datatype or DTYPES[tensor.dtype],
                           constant_buffer_idx=len(self.graph.constant_data) - 1)

    def node(self, kind: G.NodeKind, params: G.NodeParams,
             output_min_max: tuple[float, float] | None = None) -> None:
        self.graph.nodes.append(G.Node(kind, params, output_min_max=output_min_max))

    def finish(self) -> G.XnnpackBlob:
        for ext, value_id in enumerate(self._inputs + self._outputs):
            self.graph.values[value_id].external_id = ext
        self.graph.input_ids = list(self._inputs)
        self.graph.output_ids = list(self._outputs)
        self.graph.num_externs = len(self._inputs) + len(self._outputs)
        return G.XnnpackBlob(self.graph, bytes(self.region))

    def compile(self) -> CompiledGraph:
        return XnnpackBackend().prepare(self.finish(), NamedContext(self.named))  # type: ignore[arg-type]

    def run(self, *inputs: torch.Tensor, compiled: CompiledGraph | None = None
            ) -> list[torch.Tensor]:
        compiled = compiled or self.compile()
        outs = [torch.zeros(self.graph.values[v].dims,
                            dtype=TORCH_DTYPES[self.graph.values[v].datatype])
                for v in self._outputs]
        execute(compiled, [*inputs, *outs])
        return outs
