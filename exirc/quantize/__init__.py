"""The quantize stage: captured float methods -> quantized ATen-dialect methods.

Between capture and the ATen stage, `--quantize MODE` rewrites each method:

- `int8`: post-training static quantization through torchao's pt2e flow
  (`prepare_pt2e`, calibration on the given inputs, `convert_pt2e`) with
  exirc's own quantizer (`exirc.quantize.quantizer`), and embedding tables
  int8 per row (weight-only: an embedding has no activation to quantize);
- `int8-weight-only`, `int4-weight-only`: linear and embedding weights stored
  as integers with group-wise scales (`exirc.quantize.weight_only`).

Either way the result is re-exported, so what the pipeline gets is an
ordinary ATen-dialect program with `quantized_decomposed` Q/DQ ops, as if the
user had quantized the model themselves; the quantized graph module is also
the reference `--verify` compares the program with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from exirc.errors import ModelError, UsageError

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import GraphModule

    from exirc.quantize.weight_only import QuantizedWeight

MODES = ("int8", "int8-weight-only", "int4-weight-only", "8da4w", "8da8w")
DYNAMIC_MODES = ("8da4w", "8da8w")  # int8 activations per token at run time
EMBEDDING_MODES = ("none", "int8", "int4")  # --quantize-embeddings
EMBEDDING_CHOICE_MODES = ("int8", *DYNAMIC_MODES)  # the modes that take it


@dataclass(frozen=True)
class QuantizeConfig:
    mode: str
    group_size: int | None = None  # weight-only: values per scale (None: the mode's default)
    # int8, 8da4w, 8da8w: embedding tables as int8 / int4 rows (the weight-only
    # modes' groups), read by ExecuTorch's quantized embedding kernels; "none"
    # keeps them float (`default_embeddings` says what each mode does unasked).
    embeddings: str = "none"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown quantization mode {self.mode!r}",
                             hint=f"modes: {', '.join(MODES)}")
        if self.group_size is not None:
            if self.mode in ("int8", "8da8w"):
                raise UsageError(f"a group size applies to the weight-only modes and 8da4w, "
                                 f"not {self.mode}",
                                 hint=f"{self.mode} quantizes weights per output channel")
            if self.group_size < 2 or self.group_size % 2:
                raise UsageError(f"group size {self.group_size} must be an even number >= 2")
        if self.embeddings not in EMBEDDING_MODES:
            raise UsageError(f"unknown embedding quantization {self.embeddings!r}",
                             hint=f"choose one of {', '.join(EMBEDDING_MODES)}")
        if self.embeddings != "none" and self.mode not in EMBEDDING_CHOICE_MODES:
            raise UsageError(f"--quantize-embeddings applies to int8, 8da4w and 8da8w, not "
                             f"{self.mode or 'a float model'}",
                             hint="the weight-only modes quantize embeddings already")

    @property
    def bits(self) -> int:
        return 4 if self.mode.startswith("int4") or self.mode == "8da4w" else 8


@dataclass
class QuantizedMethod:
    module: GraphModule  # the quantized model, as torch runs it (the reference)
    program: ExportedProgram  # re-exported: the ATen-dialect input of the pipeline
    weights: list[QuantizedWeight]  # weight-only: what was quantized
    quantized_ops: int  # static: ops whose weights or activations are quantized
    # static: the quantized layers' integer weights, by content (`content_digest`),
    # so methods sharing layers count them once
    layers: frozenset[str] = frozenset()


def quantize_method(exported: ExportedProgram, config: QuantizeConfig,
                    calibration: Sequence[tuple[Any, ...]], example_inputs: tuple[Any, ...],
                    dynamic_shapes: Any, where: str) -> QuantizedMethod:
    """Quantize one captured method. `calibration` holds the argument tuples the
    static mode observes; `where` names the method for messages."""
    from exirc.capture.export_failures import quiet_torch
    from exirc.quantize.dynamic import quantize_dynamic
    from exirc.quantize.weight_only import quantize_weights

    if dynamic_shapes is None and _has_dynamic_inputs(exported):
        raise ModelError(f"{where}: the program has dynamic shapes, which quantizing would "
                         "lose: re-exporting needs the model's dynamic_shapes",
                         hint="quantize the model file (with `dynamic_shapes`) rather than a "
                              ".pt2 archive, or export the archive with static shapes")
    module = exported.module()
    quantized_ops, layers = 0, frozenset[str]()
    if config.mode == "int8":
        module, layers = _static_int8(module, calibration, where)
        quantized_ops = len(layers)
        weights = _embedding_tables(module, config.embeddings)
    elif config.mode in DYNAMIC_MODES:
        weights = _embedding_tables(module, config.embeddings)
        weights += quantize_dynamic(module, config.bits, config.group_size)
    else:
        weights = quantize_weights(module, config.bits, config.group_size)
    if not weights and not quantized_ops:
        raise ModelError(f"{where}: --quantize {config.mode} found nothing to quantize",
                         hint="it quantizes float conv and linear layers (int8) or linear and "
                              "embedding weights (weight-only); a model quantized already "
                              "compiles as it is: compile without --quantize")
    try:
        with quiet_torch():
            program = torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes,
                                          strict=False)
    except Exception as error:
        raise ModelError(f"{where}: exporting the quantized model failed: "
                         f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}",
                         hint="rerun with --debug to see the traceback") from error
    return QuantizedMethod(module, program, weights, quantized_ops, layers)


def _embedding_tables(module: GraphModule, embeddings: str) -> list[Any]:
    """Embedding tables are weights pt2e and the dynamic modes leave float; in
    language models they are most of the bytes. Asked for, they become int8 or
    int4 rows read by embedding_byte / embedding_4bit (ExecuTorch's quantized
    kernel library, outside any delegate)."""
    from exirc.quantize.weight_only import quantize_weights

    if embeddings == "none":
        return []
    return list(quantize_weights(module, 8 if embeddings == "int8" else 4,
                                 embeddings_only=True))


def default_embeddings(mode: str, delegated: bool) -> str:
    """What `--quantize MODE` does with embedding tables unless told: int8 rows
    for static int8 on a target without a delegate (the portable runtime then
    has the quantized kernels a file of quantized ops needs anyway); float
    under a delegate, as ExecuTorch's own int8 XNNPACK lowering keeps them, so
    the file needs no kernels outside its delegates; float for 8da4w / 8da8w."""
    return "int8" if mode == "int8" and not delegated else "none"


def _static_int8(module: GraphModule, calibration: Sequence[tuple[Any, ...]],
                 where: str) -> tuple[GraphModule, frozenset[str]]:
    try:
        from torchao.quantization.pt2e import move_exported_model_to_eval
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as error:
        raise UsageError("--quantize int8 needs torchao's pt2e quantization, which is not "
                         "installed", hint="install exirc's quantize extra: "
                                           "pip install 'exirc[quantize]'") from error
    from exirc.quantize.quantizer import make_quantizer

    already = _per_channel_weights(module)
    step = "preparing the model for calibration (torchao's prepare_pt2e)"
    # Calibrating runs the model: a KV cache it writes must not keep what the
    # calibration inputs wrote (the model's buffers are the captured program's,
    # and the quantized program's state starts from them).
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        prepared = prepare_pt2e(module, make_quantizer())
        step = "calibrating"
        with torch.no_grad():
            for args in calibration:
                prepared(*args)
        for buffer, value in buffers:
            buffer.data.copy_(value)
        step = "converting the calibrated model (torchao's convert_pt2e)"
        converted = convert_pt2e(prepared)
    except Exception as error:
        raise ModelError(f"{where}: {step} failed: {type(error).__name__}: "
                         f"{(str(error).splitlines() or [''])[0]}",
                         hint="rerun with --debug to see the traceback; a weight-only "
                              "mode may still apply") from error
    move_exported_model_to_eval(converted)
    torch.nn.Module.train(converted, False)
    # Weights dequantized per channel are the layers quantized, less those the
    # model came with (a model quantized already gains none).
    return converted, _per_channel_weights(converted) - already


def _per_channel_weights(module: GraphModule) -> frozenset[str]:
    """The integer weights `module` dequantizes per channel, by content."""
    from exirc.ir.content import content_digest

    dequantize = torch.ops.quantized_decomposed.dequantize_per_channel.default
    found = set()
    for node in module.graph.nodes:
        if node.target != dequantize:
            continue
        weight, scales = (_constant(module, arg) for arg in node.args[:2])
        key = [t for t in (weight, scales) if t is not None]
        found.add(content_digest(*key) if weight is not None else f"node {node.name}")
    return frozenset(found)


def _constant(module: GraphModule, arg: Any) -> torch.Tensor | None:
    if not isinstance(arg, torch.fx.Node) or arg.op != "get_attr":
        return None
    value: Any = module
    for part in str(arg.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _has_dynamic_inputs(exported: ExportedProgram) -> bool:
    for node in exported.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and \
                any(isinstance(size, torch.SymInt) for size in value.shape):
            return True
    return False
