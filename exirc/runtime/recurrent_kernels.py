"""The kernel of `exirc::lstm.out`: a whole `nn.LSTM` in torch's fused C++ loop.

Unrolled, an LSTM is a dozen small ops per layer, direction and time step,
each paying the interpreter's dispatch; `--target exirc` keeps the call whole
(`exirc.backend.lstm`) and this kernel runs it with `torch.lstm`, as eager
PyTorch does. Its arguments come from a file, so the kernel checks what
torch's own checks leave open before anything is written: inference only,
one dtype, the parameter count of the layers and directions it is told, and
outs of exactly the sizes and dtype the LSTM makes (they are planned memory:
never resized). torch itself refuses weights and states whose sizes do not
chain. Any refusal is an `ExecutionError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from exirc.runtime.errors import ExecutionError

LSTM_OUT_SCHEMA = (
    "exirc::lstm.out(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, "
    "int num_layers, float dropout, bool train, bool bidirectional, bool batch_first, *, "
    "Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2) -> (Tensor(a!), Tensor(b!), Tensor(c!))")


def _fail(message: str) -> NoReturn:
    raise ExecutionError(f"exirc::lstm: {message}",
                         hint="the program file is malformed; recompile the model")


def _check_lstm(input: torch.Tensor, hx: Sequence[torch.Tensor],
                params: Sequence[torch.Tensor], has_biases: bool, num_layers: int,
                train: bool, bidirectional: bool) -> None:
    if train:
        _fail("train is true: the kernel runs inference only")
    if input.dtype not in (torch.float32, torch.float64):
        _fail(f"input must be float32 or float64, not {input.dtype}")
    if input.dim() not in (2, 3):
        _fail(f"input has {input.dim()} dims: an LSTM takes 2 (unbatched) or 3")
    if len(hx) != 2:
        _fail(f"hx holds {len(hx)} tensors: an LSTM takes (h0, c0)")
    per_layer = (4 if has_biases else 2) * (2 if bidirectional else 1)
    if not 1 <= num_layers <= 1024 or len(params) != per_layer * num_layers:
        _fail(f"{len(params)} params for num_layers {num_layers}: expected {per_layer} "
              "per layer")
    for label, tensors in (("hx", hx), ("params", params)):
        for k, tensor in enumerate(tensors):
            if tensor.dtype != input.dtype:
                _fail(f"{label}[{k}] is {tensor.dtype}, but input is {input.dtype}")


def lstm_out(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
             has_biases: bool, num_layers: int, dropout: float, train: bool,
             bidirectional: bool, batch_first: bool, *, out0: torch.Tensor,
             out1: torch.Tensor, out2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(output, h_n, c_n) of `torch.lstm` in inference, copied into the outs."""
    _check_lstm(input, hx, params, has_biases, num_layers, train, bidirectional)
    try:
        results = torch.lstm(input, list(hx), list(params), bool(has_biases), num_layers,
                             0.0, False, bool(bidirectional), bool(batch_first))
    except RuntimeError as error:  # torch's own size checks: weights, states, input
        _fail(f"torch refuses the arguments: {str(error).splitlines()[0]}")
    outs = (out0, out1, out2)
    for k, (out, result) in enumerate(zip(outs, results)):
        if out.shape != result.shape or out.dtype != result.dtype:
            _fail(f"out{k} is {out.dtype} {list(out.shape)}, but the LSTM makes "
                  f"{result.dtype} {list(result.shape)}")
    for out, result in zip(outs, results):
        out.copy_(result)
    return out0, out1, out2


RECURRENT_KERNELS: dict[str, Callable[..., Any]] = {LSTM_OUT_SCHEMA: lstm_out}
"""Schema -> kernel, merged into `exirc.runtime.exirc_ops.OWN_KERNELS`."""
