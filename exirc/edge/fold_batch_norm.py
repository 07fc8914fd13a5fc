"""Batch-norm folding: an inference batch norm after a convolution becomes
part of the convolution's weight and bias, computed once at compile time.

In eval mode a batch norm is an affine map per channel,
`y = (x - mean) * gamma / sqrt(var + eps) + beta`, and a convolution is
linear per output channel, so the two compose into one convolution with
`w' = w * s` and `b' = (b - mean) * s + beta`, where `s = gamma / sqrt(var + eps)`.
Measured on the zoo's CNNs, the batch norms were 17-30% of a run; folded, they
cost nothing.

The fold is computed in float64 and rounded once to the weight's dtype, so
its only difference from eager PyTorch is that one rounding (well inside the
verify tolerances).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import Node

from exirc.edge.constants import add_constant, constant_tensor, input_target
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

aten = torch.ops.aten

_INFERENCE_BATCH_NORM = aten._native_batch_norm_legit_no_training.default
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class _Foldable:
    """A convolution and the inference batch norm that alone reads it, with
    every tensor the fold needs (all constants of the program)."""

    convolution: Node
    batch_norm: Node
    weight: torch.Tensor
    bias: torch.Tensor | None
    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    mean: torch.Tensor
    var: torch.Tensor
    eps: float


def _constant_or_none(program: ExportedProgram, arg: object) -> tuple[bool, torch.Tensor | None]:
    """(usable, tensor): None is usable (an absent affine parameter); a node is
    usable only when it is a constant of the program (not state it updates)."""
    if arg is None:
        return True, None
    if not isinstance(arg, Node):
        return False, None
    tensor = constant_tensor(program, arg)
    return tensor is not None, tensor


def _only_output_read(batch_norm: Node) -> Node | None:
    """The getitem reading a batch norm's normalized output, when nothing reads
    its other outputs (the saved statistics, which folding would lose)."""
    readers = list(batch_norm.users)
    if len(readers) != 1:
        return None
    (reader,) = readers
    if reader.target is not operator.getitem or reader.args[1] != 0:
        return None
    return reader


def _foldable(program: ExportedProgram, batch_norm: Node) -> _Foldable | None:
    """What folding `batch_norm` into its convolution needs, or None when the
    fold would change what the program computes or remembers."""
    conv = batch_norm.args[0]
    if not isinstance(conv, Node) or conv.target is not aten.convolution.default:
        return None
    if len(conv.users) != 1 or _only_output_read(batch_norm) is None:
        return None  # another reader needs the un-normalized convolution output
    _, weight_arg, bias_arg, _stride, _padding, _dilation, transposed, *_ = conv.args
    if transposed:
        return None  # its weight holds output channels on dim 1: not worth the case
    gamma_arg, beta_arg, mean_arg, var_arg, _momentum, eps = batch_norm.args[1:7]
    found = [_constant_or_none(program, a)
             for a in (weight_arg, bias_arg, gamma_arg, beta_arg, mean_arg, var_arg)]
    if not all(usable for usable, _ in found) or not isinstance(eps, (int, float)):
        return None
    weight, bias, gamma, beta, mean, var = (tensor for _, tensor in found)
    if weight is None or mean is None or var is None or weight.dtype not in _FLOAT_DTYPES:
        return None
    channels = weight.shape[0]
    for tensor in (bias, gamma, beta, mean, var):
        if tensor is not None and tuple(tensor.shape) != (channels,):
            return None
    return _Foldable(conv, batch_norm, weight, bias, gamma, beta, mean, var, float(eps))


def folded_weight_and_bias(f: _Foldable) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution's weight and bias with the batch norm applied, computed
    in float64 and rounded once to the weight's dtype."""
    wide = torch.float64
    with torch.no_grad():  # parameters require grad; the folded constants must not
        return _fold_in(f, wide)


def _fold_in(f: _Foldable, wide: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.rsqrt(f.var.to(wide) + f.eps)
    if f.gamma is not None:
        scale = scale * f.gamma.to(wide)
    bias = torch.zeros_like(scale) if f.bias is None else f.bias.to(wide)
    bias = (bias - f.mean.to(wide)) * scale
    if f.beta is not None:
        bias = bias + f.beta.to(wide)
    shape = (-1,) + (1,) * (f.weight.dim() - 1)
    weight = f.weight.to(wide) * scale.reshape(shape)
    return weight.to(f.weight.dtype).contiguous(), bias.to(f.weight.dtype)


def _described(program: ExportedProgram, node: object, what: str) -> str:
    target = input_target(program, node) if isinstance(node, Node) else None
    return f"{target or 'convolution'} ({what})"


@dataclass(frozen=True)
class FoldBatchNorm(Pass):
    """Edge -> Edge: inference batch norms fold into the convolution before them.

    Folds `_native_batch_norm_legit_no_training` (what export gives for a
    batch norm in eval mode) only when its input is a (non-transposed)
    `convolution` that nothing else reads, only its normalized output is
    read, and the convolution's weight and bias and the norm's parameters and
    running statistics are all constants of the program (never state it
    updates). The old weights are left for dead-code elimination.
    """

    name: ClassVar[str] = "fold_batch_norm"

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        changed = False
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not _INFERENCE_BATCH_NORM:
                continue
            fold = _foldable(program, node)
            if fold is None:
                continue
            self._fold(program, fold)
            changed = True
        if changed:
            graph.eliminate_dead_code()
            program.graph_module.recompile()
        return PassResult(program, changed)

    @staticmethod
    def _fold(program: ExportedProgram, fold: _Foldable) -> None:
        conv, batch_norm = fold.convolution, fold.batch_norm
        weight, bias = folded_weight_and_bias(fold)
        weight_arg = conv.args[1]
        weight_node = add_constant(program, f"{conv.name}_folded_weight", weight,
                                   _described(program, weight_arg, "batch norm folded"))
        bias_node = add_constant(program, f"{conv.name}_folded_bias", bias,
                                 _described(program, weight_arg, "folded bias"))
        args = list(conv.args)
        args[1], args[2] = weight_node, bias_node
        conv.args = tuple(args)
        output = _only_output_read(batch_norm)
        assert output is not None  # _foldable checked
        output.replace_all_uses_with(conv)
        program.graph_module.graph.erase_node(output)
        program.graph_module.graph.erase_node(batch_norm)
