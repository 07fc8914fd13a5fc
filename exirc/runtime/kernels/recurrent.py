"""The kernel of `exirc::lstm.out`: a whole `nn.LSTM` in torch's fused C++ loop.

Unrolled, an LSTM is a dozen small ops per layer, direction and time step,
each paying the interpreter's dispatch; `--target exirc` keeps the call whole
(`exirc.backend.lstm`) and this kernel runs it with `torch.lstm`, as eager
PyTorch does. Its arguments come from a file, so the kernel checks what
torch's own checks leave open before anything is written: inference only,
one dtype, the parameter count of the layers and directions it is told, the
size of every state and weight (torch's CPU LSTM does not check them all:
weights of the wrong width run, reading what they should not), and outs of
exactly the sizes and dtype the LSTM makes (planned memory: never resized).
Any refusal is an `ExecutionError`.
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
                train: bool, bidirectional: bool, batch_first: bool) -> None:
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
    _check_sizes(input, hx, params, has_biases, num_layers, bidirectional, batch_first)


def _check_sizes(input: torch.Tensor, hx: Sequence[torch.Tensor],
                 params: Sequence[torch.Tensor], has_biases: bool, num_layers: int,
                 bidirectional: bool, batch_first: bool) -> None:
    """Every state and weight of the size the input and the hidden size make."""
    directions = 2 if bidirectional else 1
    if hx[0].dim() != input.dim():
        _fail(f"hx[0] has {hx[0].dim()} dims, but input has {input.dim()}")
    hidden = hx[0].shape[-1]
    # (layers x directions, batch, hidden); unbatched: no batch dim.
    batch = [] if input.dim() == 2 else [input.shape[0 if batch_first else 1]]
    state = [num_layers * directions, *batch, hidden]
    for k, tensor in enumerate(hx):
        if list(tensor.shape) != state:
            _fail(f"hx[{k}] has shape {list(tensor.shape)}, expected {state}")
    per_direction = 4 if has_biases else 2
    width = input.shape[-1]
    for layer in range(num_layers):
        for direction in range(directions):
            first = (layer * directions + direction) * per_direction
            expected = [[4 * hidden, width], [4 * hidden, hidden]]
            expected += [[4 * hidden], [4 * hidden]] if has_biases else []
            for k, sizes in enumerate(expected, start=first):
                if list(params[k].shape) != sizes:
                    _fail(f"params[{k}] has shape {list(params[k].shape)}, expected {sizes} "
                          f"(layer {layer}, direction {direction}, hidden size {hidden})")
        width = directions * hidden


def lstm_out(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
             has_biases: bool, num_layers: int, dropout: float, train: bool,
             bidirectional: bool, batch_first: bool, *, out0: torch.Tensor,
             out1: torch.Tensor, out2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(output, h_n, c_n) of `torch.lstm` in inference, copied into the outs."""
    _check_lstm(input, hx, params, has_biases, num_layers, train, bidirectional, batch_first)
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
"""Schema -> kernel, merged into `exirc.runtime.kernels.exirc_ops.OWN_KERNELS`."""
