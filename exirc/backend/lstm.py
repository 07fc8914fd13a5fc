"""Keep `nn.LSTM` whole: `aten.lstm.input` becomes exirc's `exirc::lstm` op.

torch's decomposition of `aten.lstm` unrolls every layer, direction and time
step into a dozen small ops per step; exirc's interpreter pays a dispatch for
each, where eager PyTorch runs one C++ loop. `KeepLstm` (an ATen-stage pass,
before `to_edge` decomposes) swaps the call's target for `exirc::lstm`, a
torch.library op with the same schema that no decomposition table knows, so
the Edge program keeps it as one call; its out-variant `exirc::lstm.out` is
bound as a backend op (the kernel set `backend_ops`), and the runtime's kernel
(`exirc.runtime.recurrent_kernels`) calls torch's fused `torch.lstm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from exirc.backend.ops import bind_pattern_to_op
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

_ARGUMENTS = ("Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, "
              "float dropout, bool train, bool bidirectional, bool batch_first")
LSTM_SCHEMA = f"lstm({_ARGUMENTS}) -> (Tensor, Tensor, Tensor)"
# The runtime has its own copy (exirc.runtime.recurrent_kernels, with the kernel):
# the compiler may not import the runtime. tests/backend checks they agree.
LSTM_OUT_SCHEMA = (f"exirc::lstm.out({_ARGUMENTS}, *, Tensor(a!) out0, Tensor(b!) out1, "
                   "Tensor(c!) out2) -> (Tensor(a!), Tensor(b!), Tensor(c!))")

_LIBRARY = torch.library.Library("exirc", "FRAGMENT")  # noqa: TOR901 (ours, kept alive)
_LIBRARY.define(LSTM_SCHEMA)
_LIBRARY.define(LSTM_OUT_SCHEMA.removeprefix("exirc::"))


def _lstm(input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
          has_biases: bool, num_layers: int, dropout: float, train: bool,
          bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, ...]:
    """torch's own LSTM: the reference the op stands for (fake tensors trace it too)."""
    output, h, c = torch.ops.aten.lstm.input(input, hx, params, has_biases, num_layers,
                                             dropout, train, bidirectional, batch_first)
    return output, h, c


def _lstm_out(input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
              has_biases: bool, num_layers: int, dropout: float, train: bool,
              bidirectional: bool, batch_first: bool, *, out0: torch.Tensor,
              out1: torch.Tensor, out2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    results = _lstm(input, hx, params, has_biases, num_layers, dropout, train,
                    bidirectional, batch_first)
    for out, result in zip((out0, out1, out2), results):
        out.resize_(result.shape).copy_(result)
    return out0, out1, out2


for _key in ("CompositeExplicitAutograd", "Meta"):
    _LIBRARY.impl("lstm", _lstm, _key)
    _LIBRARY.impl("lstm.out", _lstm_out, _key)

lstm_op = torch.ops.exirc.lstm.default


@bind_pattern_to_op(LSTM_OUT_SCHEMA)  # its kernel: exirc.runtime.recurrent_kernels
def lstm_out(input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
             has_biases: bool, num_layers: int, dropout: float, train: bool,
             bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, ...]:
    """The backend op behind `exirc::lstm`'s out-variant, so the `backend_ops`
    kernel set names it; its pattern is torch's LSTM."""
    return _lstm(input, hx, params, has_biases, num_layers, dropout, train,
                 bidirectional, batch_first)


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
