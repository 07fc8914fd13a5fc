"""Which operators XNNPACK takes with dynamic (upper-bounded) dims.

ExecuTorch's XNNPACK runtime hands XNNPACK each call's input shapes and
XNNPACK recomputes every value's shape from them, operator by operator
(`sizes` says how a payload is built for it). That is exact for operators
whose shapes follow from their inputs alone: elementwise ones, matrix
products, softmax, transposes, concatenation, reductions and normalization
over static dims, slices along a static dim (a dynamic dim is taken whole),
reshapes with one dynamic dim (the one XNNPACK infers). It is not for those
whose payload parameters would hold a size: a slice along a dynamic dim, a
pad, a reshape with more than one dynamic dim, an expand or repeat of a
dynamic dim, a size used as a number; convolutions and pooling are left out
too (not yet checked against ExecuTorch's runtime). Those stay outside the
delegate, with the reason this module gives."""

from __future__ import annotations

import torch
from torch.fx import Node

from exirc.backend.delegation.cut import size_source
from exirc.backend.xnnpack.args import arg, as_ints, as_node
from exirc.backend.xnnpack.sizes import is_dynamic
from exirc.backend.xnnpack.support_rules import Reason, op_name

aten = torch.ops.aten

# Shapes follow from the inputs alone.
FOLLOWING = frozenset({
    aten.sigmoid.default, aten.tanh.default, aten.gelu.default, aten.abs.default,
    aten.neg.default, aten.sqrt.default, aten.rsqrt.default, aten.floor.default,
    aten.ceil.default, aten.exp.default, aten.log.default, aten.sin.default, aten.cos.default,
    aten.hardswish.default, aten.relu.default, aten.hardtanh.default, aten.clamp.default,
    aten.clamp.Tensor, aten.leaky_relu.default, aten.reciprocal.default, aten.clone.default,
    aten.alias_copy.default, aten._to_copy.default, aten.elu.default, aten.pow.Tensor_Scalar,
    aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.minimum.default,
    aten.maximum.default, aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar,
    aten.permute_copy.default, aten.mm.default, aten.bmm.default, aten.addmm.default,
    aten.cat.default, aten._softmax.default,
})
RESHAPES = frozenset({aten.view_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims,
                      aten.squeeze_copy.default, aten.unsqueeze_copy.default})
# Slices along a static dim; select and unbind also reshape the dim away.
SLICES = {aten.slice_copy.Tensor: 1, aten.split_with_sizes_copy.default: 2,
          aten.split_copy.Tensor: 2, aten.select_copy.int: 1, aten.unbind_copy.int: 1}
DROPPING = (aten.select_copy.int, aten.unbind_copy.int)
# Operators whose size arguments give their result's shape, which the payload
# takes from the result itself.
SHAPED = RESHAPES | {aten.expand_copy.default}
REDUCTIONS = frozenset({aten.mean.dim, aten.sum.dim_IntList})


def has_dynamic_shape(node: Node) -> bool:
    """A node reading or making a tensor with a dynamic dim."""
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        vals += list(value)
    return any(is_dynamic(v) for v in vals)


def _dynamic_dims(val: torch.Tensor) -> list[int]:
    return [i for i, d in enumerate(val.shape) if not isinstance(d, int)]


def _val(node: object) -> torch.Tensor:
    value = as_node(node).meta["val"]
    return value[0] if isinstance(value, (tuple, list)) else value


def dynamic_reason(node: Node) -> Reason:
    """None when XNNPACK resizes `node` exactly at run time, else why not."""
    return _operator(node) or sizes_read(node)


def sizes_read(node: Node) -> Reason:
    """Sizes are taken as shape arguments only, from a dim of the node's own
    inputs (`cut.size_source` measures them inside the delegate)."""
    target = node.target
    for used in node.all_input_nodes:
        if not isinstance(used.meta.get("val"), torch.SymInt):
            continue
        if target not in SHAPED:  # a size used as a number: not a tensor XNNPACK reads
            return "shape", f"{op_name(node)} computes with the size {used.name}"
        if size_source(node, used) is None:
            return "shape", (f"{op_name(node)} reads the size {used.name}, which is no dim of "
                             "its tensor inputs; a delegate takes tensors only")
    return None


def _operator(node: Node) -> Reason:
    target = node.target
    if target in FOLLOWING:
        return None
    name = op_name(node)
    if target in RESHAPES:
        dims = _dynamic_dims(_val(node))
        if len(dims) > 1:
            return "shape", (f"{name} makes {len(dims)} dynamic dims {list(_val(node).shape)}; "
                             "XNNPACK's reshape infers one dim at run time")
        return None
    if target in SLICES:
        source = _val(node.args[0])
        dim = arg(node, SLICES[target], "dim", 0) % source.dim()
        if dim in _dynamic_dims(source):
            return "shape", (f"{name} slices dynamic dim {dim}; XNNPACK's static slice has "
                             "fixed bounds (a dynamic dim is taken whole only)")
        if target in DROPPING and len(_dynamic_dims(source)) > 1:
            return "shape", (f"{name} reshapes away a dim of a tensor with several dynamic "
                             "dims; XNNPACK's reshape infers one dim at run time")
        return None
    if target in REDUCTIONS:
        source = _val(node.args[0])
        given = arg(node, 1, "dim")
        reduced = range(source.dim()) if not given else [d % source.dim() for d in as_ints(given)]
        if any(d in _dynamic_dims(source) for d in reduced):
            return "shape", f"{name} reduces a dynamic dim; taken over static dims only"
        return None
    if target == aten.native_layer_norm.default:
        source = _val(node.args[0])
        count = len(node.args[1])  # type: ignore[arg-type]
        if any(d >= source.dim() - count for d in _dynamic_dims(source)):
            return "shape", f"{name} normalizes over a dynamic dim; taken over static dims only"
        return None
    if target == aten.expand_copy.default:
        source, out = _val(node.args[0]), _val(node)
        padded = [1] * (out.dim() - source.dim()) + list(source.shape)
        if any(not isinstance(o, int) and not (isinstance(p, torch.SymInt)
                                                and p.node.expr == o.node.expr)
               for p, o in zip(padded, out.shape)):
            return "shape", (f"{name} expands to a dynamic dim {list(out.shape)}; XNNPACK "
                             "expands by a multiply with ones of a fixed shape")
        return None
    return "shape", (f"{name} has a dynamic shape; XNNPACK keeps its sizes in the payload, "
                     "so it cannot follow a size that changes at run time")
