"""The ATen-stage pass that keeps `nn.LSTM` whole for `--target exirc`: each
inference `aten.lstm.input` the runtime's kernel runs as eager does becomes
`exirc::lstm` (the op and its kernel binding: `exirc.backend.lstm`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from exirc.backend.lstm import lstm_op
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def keeps(node: torch.fx.Node) -> bool:
    """Whether `node` is an LSTM the runtime's kernel runs as eager does: inference
    (train False), float32 weights and states, no projections (4 or 2 params per
    layer and direction)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.lstm.input or \
            node.kwargs or len(node.args) != 9:
        return False
    input, hx, params, has_biases, num_layers, _, train, bidirectional, _ = node.args
    if train is not False or not isinstance(num_layers, int) or num_layers < 1 or \
            not isinstance(hx, (list, tuple)) or len(hx) != 2 or \
            not isinstance(params, (list, tuple)):
        return False
    per_layer = (4 if has_biases else 2) * (2 if bidirectional else 1)
    if len(params) != per_layer * num_layers:
        return False  # projections (proj_size) add a weight per layer: not ours
    tensors: list[Any] = [input, *hx, *params]
    fakes = [t.meta.get("val") if isinstance(t, torch.fx.Node) else None for t in tensors]
    return all(isinstance(f, torch.Tensor) and f.dtype == torch.float32 for f in fakes)


@dataclass(frozen=True)
class KeepLstm(Pass):
    """ATen -> ATen: each inference `aten.lstm.input` (float32, no projections)
    becomes `exirc::lstm`, the same call under a name `to_edge` does not
    decompose; others are left for `to_edge` to unroll."""

    name: ClassVar[str] = "keep_lstm"

    def run(self, program: ExportedProgram) -> PassResult:
        changed = False
        for node in program.graph_module.graph.nodes:
            if keeps(node):
                node.target = lstm_op
                changed = True
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)
