"""exirc's pt2e quantizer: which edges of an exported graph get int8 Q/DQ.

`Int8Quantizer` annotates a graph as torchao's `prepare_pt2e` takes it:

- conv (1d/2d) and linear, and `addmm`/`mm` with a constant weight (as
  transformers' GPT-2 `Conv1D` exports): the activation input per-tensor
  affine int8, the weight per-channel symmetric int8 (axis: output channels),
  the bias left float (a backend quantizes it from the input and weight scales);
- a relu or hardtanh right after one of those, or after an add/mul, is fused:
  the quantized output is the activation's, so clamping costs nothing;
- add and mul of two tensors: both inputs and the output;
- ops that only move or pool values (max/avg pooling, mean, reshape, permute,
  flatten, cat, ...) stay in the quantized domain when their input already is:
  their output shares the input's scale and zero point, so no requantize is
  needed between them.

Everything else (norms, softmax, GELU, matmuls of two activations) stays float:
the DQ before it and the Q after it are what the graph pays for that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node

ANNOTATION = "quantization_annotation"

_aten = torch.ops.aten
_CONVS = {_aten.conv1d.default, _aten.conv2d.default}
_LINEARS = {_aten.linear.default}
_MATMULS = {_aten.addmm.default: (1, 2), _aten.mm.default: (0, 1)}  # (input, weight) args
_ACTIVATIONS = {_aten.relu.default, _aten.relu_.default, _aten.hardtanh.default,
                _aten.hardtanh_.default}
_BINARY = {_aten.add.Tensor, _aten.add_.Tensor, _aten.mul.Tensor, _aten.mul_.Tensor}
# Ops whose output is some of their input's values (or their average), so it
# can share the input's quantization: no requantize between them.
_SHARING = {_aten.max_pool2d.default, _aten.avg_pool2d.default, _aten.mean.dim,
            _aten.adaptive_avg_pool2d.default, _aten.flatten.using_ints, _aten.view.default,
            _aten.reshape.default, _aten.permute.default, _aten.transpose.int,
            _aten.squeeze.dim, _aten.unsqueeze.default, _aten.slice.Tensor,
            _aten.dropout.default, _aten.contiguous.default, _aten.clone.default}
_CAT = {_aten.cat.default, _aten.concat.default}


def _specs() -> tuple[Any, Any]:
    """(activation spec, weight spec), made lazily: torchao is imported only
    when a model is quantized."""
    from torchao.quantization.pt2e import HistogramObserver, PerChannelMinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    activation = QuantizationSpec(
        dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=HistogramObserver.with_args(eps=2 ** -12))
    weight = QuantizationSpec(
        dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_channel_symmetric,
        ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2 ** -12))
    return activation, weight


def _weight_spec(weight: Any, axis: int) -> Any:
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    if axis == weight.ch_axis:
        return weight
    return QuantizationSpec(dtype=weight.dtype, quant_min=weight.quant_min,
                            quant_max=weight.quant_max, qscheme=weight.qscheme, ch_axis=axis,
                            observer_or_fake_quant_ctr=weight.observer_or_fake_quant_ctr)


def make_quantizer() -> Any:
    """An `Int8Quantizer` (a torchao `Quantizer`; the class is built on first use
    so that importing exirc never imports torchao)."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    class Int8Quantizer(Quantizer):
        """Static int8: per-channel symmetric weights, per-tensor activations."""

        def annotate(self, model: GraphModule) -> GraphModule:
            annotate_graph(model)
            return model

        def validate(self, model: GraphModule) -> None:
            pass

    return Int8Quantizer()


def annotate_graph(model: GraphModule) -> None:
    """Annotate every node of `model` that exirc quantizes (module docstring)."""
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

    activation, weight = _specs()
    quantized: set[Node] = set()  # nodes whose output is annotated as quantized

    def annotate(node: Node, inputs: dict[Node, Any], output: Node | None) -> None:
        node.meta[ANNOTATION] = QuantizationAnnotation(input_qspec_map=inputs, _annotated=True)
        target = output or node
        if output is not None:
            output.meta[ANNOTATION] = QuantizationAnnotation(_annotated=True)
        target.meta[ANNOTATION].output_qspec = activation
        quantized.add(target)

    for node in model.graph.nodes:
        if node.op != "call_function" or ANNOTATION in node.meta:
            continue
        target = node.target
        if target in _CONVS or target in _LINEARS:
            x, w = node.args[0], node.args[1]
            if _is_float_node(x) and _is_constant(model, w):
                annotate(node, {x: activation, w: weight}, _fused_activation(node))
        elif target in _MATMULS:
            x_index, w_index = _MATMULS[target]
            x, w = node.args[x_index], node.args[w_index]
            if _is_float_node(x) and _is_constant(model, w) and _rank(w) == 2:
                annotate(node, {x: activation, w: _weight_spec(weight, 1)},
                         _fused_activation(node))
        elif target in _BINARY:
            a, b = node.args[0], node.args[1]
            if _is_float_node(a) and _is_float_node(b):
                annotate(node, {a: activation, b: activation}, _fused_activation(node))
        elif target in _SHARING or target in _ACTIVATIONS:
            source = node.args[0]
            if isinstance(source, Node) and source in quantized and _is_float_node(node):
                node.meta[ANNOTATION] = QuantizationAnnotation(
                    input_qspec_map={source: activation},
                    output_qspec=SharedQuantizationSpec((source, node)), _annotated=True)
                quantized.add(node)
        elif target in _CAT:
            parts = node.args[0]
            if isinstance(parts, (list, tuple)) and parts and \
                    all(isinstance(p, Node) and p in quantized for p in parts):
                first = parts[0]
                inputs = {first: activation}
                inputs.update({p: SharedQuantizationSpec((first, node)) for p in parts[1:]})
                node.meta[ANNOTATION] = QuantizationAnnotation(
                    input_qspec_map=inputs, output_qspec=SharedQuantizationSpec((first, node)),
                    _annotated=True)
                quantized.add(node)


def _fused_activation(node: Node) -> Node | None:
    """The relu/hardtanh that is `node`'s only user, if any: quantizing after it
    keeps the clamp inside the quantized op."""
    users = list(node.users)
    if len(users) == 1 and users[0].target in _ACTIVATIONS and users[0].args[0] is node:
        return users[0]
    return None


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _is_float_node(node: Any) -> bool:
    value = _value(node)
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32


def _rank(node: Any) -> int:
    value = _value(node)
    return value.dim() if isinstance(value, torch.Tensor) else -1


def _is_constant(model: GraphModule, node: Any) -> bool:
    """A weight: a parameter or buffer of the graph module (a get_attr node)."""
    if not isinstance(node, Node) or node.op != "get_attr":
        return False
    getter: Callable[[str], Any] = model.get_submodule
    owner, _, name = str(node.target).rpartition(".")
    try:
        module = getter(owner) if owner else model
    except AttributeError:
        return False
    value = getattr(module, name, None)
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32
