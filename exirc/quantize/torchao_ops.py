"""Models quantized with torchao's `quantize_` compile as exirc's own 8da4w / 8da8w.

`torchao.quantization.quantize_` with `Int8DynamicActivationIntxWeightConfig`
or `IntxWeightOnlyConfig` leaves weights as tensor subclasses; exported, the
graph reads their parts through `export.access_subclass_inner_tensor` and
computes with torchao's affine ops:

    choose_qparams_affine(x, "ASYMMETRIC", [1, .., 1, K], int8, -128, 127, ..)
    quantize_affine / dequantize_affine(x, [1, .., 1, K], scale, zero_point, ..)
    dequantize_affine(qdata, [1, group], scale, zero_point, int8, qmin, qmax)

`TorchaoOpsToQuantizedDecomposed` takes such an exported program (ATen
dialect, torchao ops and subclass weights) and returns an ATen-dialect
program without either: the subclass parts become plain buffers and each op
the `quantized_decomposed` op exirc's own `--quantize 8da4w / 8da8w` writes
(`choose_qparams_per_token_asymmetric`, `quantize_per_token`,
`dequantize_per_token`, `dequantize_per_channel_group`,
`dequantize_per_channel`), so the rest of the pipeline lowers them to the
same XNNPACK nodes, or runs them with the portable quantized kernels. Block
scales of 4-bit weights are rounded to bf16, as XNNPACK stores them (and as
ExecuTorch's own files of such models hold them). It matches the ops by
name; torchao itself need not be importable here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from exirc.errors import ModelError

if TYPE_CHECKING:
    from exirc.capture import MethodSource

ACCESS_INNER = "export.access_subclass_inner_tensor"
TORCHAO = "torchao."


def _name(node: Node) -> str:
    return str(node.target) if node.op == "call_function" else ""


def uses_torchao_ops(program: ExportedProgram) -> bool:
    return any(_name(n).startswith((TORCHAO, ACCESS_INNER)) for n in program.graph.nodes)


def _arguments(node: Node) -> dict[str, Any]:
    """The call's arguments by the op schema's names, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    bound: dict[str, Any] = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args):
            bound[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            bound[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


class TorchaoOpsToQuantizedDecomposed:
    """ATen dialect with torchao affine ops and subclass weights -> ATen dialect with
    exirc's `quantized_decomposed` Q/DQ ops and plain integer buffers."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, program: ExportedProgram, example_inputs: tuple[Any, ...],
                 dynamic_shapes: Any) -> tuple[ExportedProgram, GraphModule]:
        """The rewritten program, and the rewritten module it was exported from (the
        model as compiled: the reference `--verify` compares the program with)."""
        from exirc.capture.export_failures import quiet_torch

        module = program.module()
        assert isinstance(module, GraphModule)
        self.rewrite(module)
        try:
            with quiet_torch():
                return torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes,
                                           strict=False), module
        except Exception as error:
            raise ModelError(f"{self.where}: exporting the model without torchao's ops failed: "
                             f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}",
                             hint="rerun with --debug to see the traceback") from error

    def rewrite(self, module: GraphModule) -> None:
        from exirc.ir.quantize_ops import define_quantize_ops
        from exirc.quantize.graph_weights import attribute_at as _attribute
        from exirc.quantize.graph_weights import drop_unused_attributes

        self.q = define_quantize_ops()
        self.module = module
        graph = module.graph
        for node in list(graph.nodes):
            name = _name(node)
            if name.startswith(ACCESS_INNER):
                owner, attribute = node.args[0], str(node.args[1])
                assert isinstance(owner, Node) and owner.op == "get_attr"
                inner = getattr(_attribute(module, str(owner.target)), attribute)
                stored = f"{str(owner.target).replace('.', '_')}_{attribute}"
                module.register_buffer(stored, torch.Tensor(inner.detach()).clone())
                with graph.inserting_before(node):
                    node.replace_all_uses_with(graph.get_attr(stored))
                graph.erase_node(node)
        rules: dict[str, Callable[[Node, dict[str, Any]], Any]] = {
            "torchao.choose_qparams_affine.default": self._choose_qparams,
            "torchao.quantize_affine.default": self._quantize,
            "torchao.dequantize_affine.default": self._dequantize,
        }
        for node in list(graph.nodes):
            name = _name(node)
            if not name.startswith(TORCHAO):
                continue
            if name not in rules:
                raise ModelError(f"{self.where}: torchao's op {name} has no quantized_decomposed "
                                 "counterpart exirc lowers",
                                 hint="exirc takes torchao's Int8DynamicActivationIntxWeight"
                                      "Config and IntxWeightOnlyConfig models; or quantize the "
                                      "float model with --quantize 8da4w / 8da8w")
            with graph.inserting_before(node):
                replacement = rules[name](node, _arguments(node))
            replacement.meta = dict(node.meta)
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
        graph.eliminate_dead_code()
        drop_unused_attributes(module)
        module.recompile()

    # -- the ops ------------------------------------------------------------------

    def _refuse(self, node: Node, why: str) -> ModelError:
        return ModelError(f"{self.where}: {node.name} ({_name(node)}) {why}",
                          hint="exirc takes torchao's per-token asymmetric int8 activations "
                               "and symmetric int4 / int8 weights per group or channel")

    def _per_token(self, node: Node, block_size: Any) -> None:
        value = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
        if value is None or list(block_size) != [1] * (value.dim() - 1) + [value.shape[-1]]:
            raise self._refuse(node, f"quantizes blocks of {list(block_size)}, not per token")

    def _choose_qparams(self, node: Node, a: dict[str, Any]) -> Node:
        self._per_token(node, a["block_size"])
        if str(a["mapping_type"]) != "ASYMMETRIC" or a["target_dtype"] != torch.int8 or \
                (a["quant_min"], a["quant_max"]) not in ((-128, 127), (None, None)):
            raise self._refuse(node, "chooses other than asymmetric int8 parameters")
        return self.module.graph.call_function(
            self.q.choose_qparams_per_token_asymmetric.default, (a["input"], torch.int8))

    def _quantize(self, node: Node, a: dict[str, Any]) -> Node:
        self._per_token(node, a["block_size"])
        return self.module.graph.call_function(self.q.quantize_per_token.default, (
            a["input"], a["scale"], a["zero_point"], a["quant_min"], a["quant_max"],
            torch.int8))

    def _dequantize(self, node: Node, a: dict[str, Any]) -> Node:
        graph = self.module.graph
        source = a["input"]
        out_dtype = a.get("output_dtype") or torch.float32
        if not (isinstance(source, Node) and source.op == "get_attr"):  # an activation
            self._per_token(node, a["block_size"])
            return graph.call_function(self.q.dequantize_per_token.default, (
                source, a["scale"], a["zero_point"], a["quant_min"], a["quant_max"],
                torch.int8, out_dtype))
        from exirc.quantize.graph_weights import attribute_at as _attribute

        values = _attribute(self.module, str(source.target))
        block = list(a["block_size"])
        if values.dim() != 2 or len(block) != 2 or block[0] != 1 or values.shape[1] % block[1]:
            raise self._refuse(node, f"dequantizes a weight {list(values.shape)} in blocks "
                                     f"of {block}, not per output channel or group")
        zero_point = a["zero_point"]
        if isinstance(zero_point, Node):
            zeros = _attribute(self.module, str(zero_point.target))
            if zeros is None or bool(torch.as_tensor(zeros).any()):
                raise self._refuse(node, "has weight zero points other than 0 (asymmetric "
                                         "weights)")
        scale = a["scale"]
        assert isinstance(scale, Node) and scale.op == "get_attr"
        scales = _attribute(self.module, str(scale.target))
        rows, columns = values.shape
        group = block[1]
        quant_min, quant_max = a["quant_min"], a["quant_max"]
        if group == columns and (quant_min, quant_max) == (-128, 127):
            self.module.register_buffer(str(scale.target), scales.reshape(rows).float(),
                                        persistent=True)
            return graph.call_function(self.q.dequantize_per_channel.default, (
                source, scale, None, 0, quant_min, quant_max, torch.int8))
        # XNNPACK keeps block scales in bf16 (ExecuTorch's files round torchao's float32
        # ones): rounded here, as --quantize 8da4w does, so every target computes the same.
        self.module.register_buffer(str(scale.target), scales.reshape(rows, columns // group)
                                    .to(torch.bfloat16).float(), persistent=True)
        return graph.call_function(self.q.dequantize_per_channel_group.default, (
            source, scale, None, quant_min, quant_max, torch.int8, group, out_dtype))


def without_torchao_ops(sources: dict[str, MethodSource],
                        exported: dict[str, ExportedProgram]
                        ) -> tuple[dict[str, MethodSource], dict[str, ExportedProgram]]:
    """Methods of a model quantized with torchao's `quantize_`: their torchao ops as
    exirc's quantized_decomposed ones (`exirc.quantize.torchao_ops`); the rewritten
    module (4-bit block scales in bf16, as XNNPACK keeps them) is their reference."""
    new_sources, new_exported = dict(sources), dict(exported)
    for name, program in exported.items():
        if uses_torchao_ops(program):
            source = sources[name]
            convert = TorchaoOpsToQuantizedDecomposed(f"method {name!r}")
            new_exported[name], module = convert(program, source.example_inputs,
                                                 source.dynamic_shapes)
            new_sources[name] = dataclasses.replace(source, module=module, exported=None)
    return new_sources, new_exported
