"""Keep `nn.LSTM` whole: `aten.lstm.input` becomes exirc's `exirc::lstm` op.

torch's decomposition of `aten.lstm` unrolls every layer, direction and time
step into a dozen small ops per step; exirc's interpreter pays a dispatch for
each, where eager PyTorch runs one C++ loop. `KeepLstm` (an ATen-stage pass,
before `to_edge` decomposes: `exirc.backend.keep_lstm`) swaps the call's target for `exirc::lstm`, a
torch.library op with the same schema that no decomposition table knows, so
the Edge program keeps it as one call; its out-variant `exirc::lstm.out` is
bound as a backend op (the kernel set `backend_ops`), and the runtime's kernel
(`exirc.runtime.kernels.recurrent`) calls torch's fused `torch.lstm`.
"""

from __future__ import annotations

import torch

from exirc.backend.ops import bind_pattern_to_op

_ARGUMENTS = ("Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, "
              "float dropout, bool train, bool bidirectional, bool batch_first")
LSTM_SCHEMA = f"lstm({_ARGUMENTS}) -> (Tensor, Tensor, Tensor)"
# The runtime has its own copy (exirc.runtime.kernels.recurrent, with the kernel):
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


@bind_pattern_to_op(LSTM_OUT_SCHEMA)  # its kernel: exirc.runtime.kernels.recurrent
def lstm_out(input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
             has_biases: bool, num_layers: int, dropout: float, train: bool,
             bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, ...]:
    """The backend op behind `exirc::lstm`'s out-variant, so the `backend_ops`
    kernel set names it; its pattern is torch's LSTM."""
    return _lstm(input, hx, params, has_biases, num_layers, dropout, train,
                 bidirectional, batch_first)
