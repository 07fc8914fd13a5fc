"""Shape inference at init: every node run once on meta tensors (shapes, no memory).

XNNPACK itself trusts only the dims of external inputs and constants: when
ExecuTorch's runtime reshapes a graph, XNNPACK recomputes every other value's
shape from them, node by node. The dims a blob declares for internal values
are a hint, and ExecuTorch's serializer does write some that disagree with
what the nodes compute (a dynamically quantized convolution input keeps its
NCHW dims while the data is NHWC). So we do what XNNPACK does: while the
graph is compiled, each node's closure is run on meta tensors right after it
is built, and what it produces is the shape later nodes are checked against
(for the common ops, as `meta_rules` knows torch's meta kernels would).

A node that cannot run on its inputs' shapes (a filter that does not fit,
a reshape that changes the element count, a slice past the end) is refused
here with a `FormatError` naming it, as is a node producing the wrong
datatype, a value larger than the memory there is (a hostile blob can ask for
terabytes in a few bytes), or an external output whose shape is not the one
the blob declares (the program sized its memory by it).
"""

from __future__ import annotations

import math

import torch

from exirc.errors import FormatError
from exirc.runtime.delegates.xnnpack.constants import STORAGE_TYPES, datatype_name
from exirc.runtime.delegates.xnnpack.context import Env, Op
from exirc.runtime.delegates.xnnpack.quant import Dynamic
from exirc.runtime.kernels.meta_rules import KnownResults
from exirc.runtime.machine import available_memory
from exirc.serialize.xnnpack import graph as G

Slots = dict[int, tuple[int, G.TensorValue]]


class ShapeCheck:
    """The meta run, node by node; `shapes` maps each defined slot to its inferred dims."""

    def __init__(self, graph: G.XNNGraph, slots: Slots, constants: dict[int, torch.Tensor],
                 inputs: list[tuple[int, torch.dtype, tuple[int, ...]]], where: str) -> None:
        self.graph = graph
        self.where = where
        self.env: Env = [None] * len(graph.values)
        self.shapes: dict[int, tuple[int, ...]] = {}
        for value_id, tensor in constants.items():
            slot = slots[value_id][0]
            self.env[slot] = tensor
            self.shapes[slot] = tuple(tensor.shape)
        for slot, dtype, dims in inputs:
            self.env[slot] = torch.empty(dims, dtype=dtype, device="meta")
            self.shapes[slot] = dims
        self.limit = available_memory()

    def after(self, index: int, label: str, op: Op, written: list[int]) -> None:
        """Run node `index` (just built) and record what it produced."""
        field = f"{self.where}.nodes[{index}]"
        try:
            # The common ops' results come from `meta_rules`, not from torch's
            # Python meta kernels: those import torch._dynamo and sympy (over a
            # second) on first use.
            with KnownResults():
                op(self.env)
        except Exception as error:  # noqa: BLE001 (torch's shape checks, any kind)
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise FormatError(f"{label} does not fit its inputs' dims: {detail}",
                              field=field) from None
        for slot in written:
            value = self.graph.values[slot]
            result = self.env[slot]
            if isinstance(result, Dynamic):
                result = result.values
            if not isinstance(result, torch.Tensor):
                raise FormatError(f"{label} produced no tensor for value {value.id_out}",
                                  field=field)
            if result.dtype != STORAGE_TYPES.get(value.datatype):
                raise FormatError(f"{label} produces {result.dtype} for value {value.id_out}, "
                                  f"which is {datatype_name(value.datatype)}", field=field)
            nbytes = math.prod(result.shape) * result.dtype.itemsize
            if self.limit is not None and nbytes > self.limit:
                raise FormatError(f"{label} produces {list(result.shape)} for value "
                                  f"{value.id_out}: {nbytes} bytes, more than the {self.limit} "
                                  "bytes of memory available", field=field)
            self.shapes[slot] = tuple(result.shape)

    def check_output(self, slot: int) -> None:
        """An external output must have the dims the blob declares for it."""
        value = self.graph.values[slot]
        if list(self.shapes[slot]) != list(value.dims):
            raise FormatError(f"external output {value.id_out} is computed with dims "
                              f"{list(self.shapes[slot])}, but declares {list(value.dims)}",
                              field=f"{self.where}.output_ids")
