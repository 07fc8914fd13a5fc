"""`--quantize`: quantize captured methods, and say what it cost and saved.

The stage itself is `exirc.quantize`; this module feeds it calibration inputs
(the `.npz` files of `--calibration-inputs`, in `--verify-inputs`' format, or
the example inputs), keeps the float model's outputs on them, and after the
compile runs the program on the same inputs to report its accuracy against
the float model: SQNR (signal-to-quantization-noise ratio, in dB; higher is
better, 20 dB is about 10% relative error, 40 dB 1%) and the largest
absolute error, per output. It also reports the weight bytes before and after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from exirc.capture import MethodSource
    from exirc.compiler import CompileResult
    from exirc.diagnostics.reference import Reference
    from exirc.quantize import QuantizeConfig
    from exirc.quantize.weight_only import QuantizedWeight
    from exirc.runtime.kernels.registry import KernelRegistry


@dataclass(frozen=True)
class OutputAccuracy:
    method: str
    output: int
    sqnr_db: float  # inf when the program reproduces the float output exactly
    max_abs_error: float


@dataclass
class QuantizationReport:
    mode: str
    group_size: int | None
    calibration: list[str]  # where the calibration inputs came from
    float_weight_bytes: int = 0
    weight_bytes: int = 0  # as stored in the program: constants and delegates' named data
    quantized_ops: int = 0  # int8: conv/linear layers quantized
    weights: list[QuantizedWeight] = field(default_factory=list)  # weight-only
    accuracy: list[OutputAccuracy] = field(default_factory=list)
    output_step: float = 0.0  # the largest quantization step of a quantized output

    @property
    def weight_ratio(self) -> float:
        return self.weight_bytes / self.float_weight_bytes if self.float_weight_bytes else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "group_size": self.group_size, "calibration": self.calibration,
            "float_weight_bytes": self.float_weight_bytes, "weight_bytes": self.weight_bytes,
            "weight_ratio": round(self.weight_ratio, 4), "quantized_ops": self.quantized_ops,
            "quantized_weights": [{"name": w.name, "shape": list(w.shape),
                                   "group_size": w.group_size, "users": w.users}
                                  for w in self.weights],
            "accuracy": [{"method": a.method, "output": a.output,
                          "sqnr_db": None if math.isinf(a.sqnr_db) else round(a.sqnr_db, 2),
                          "max_abs_error": a.max_abs_error} for a in self.accuracy],
        }


@dataclass
class Quantized:
    """The quantized methods, ready for the pipeline, and the float references."""

    sources: dict[str, MethodSource]  # each with the quantized module as its model
    exported: dict[str, ExportedProgram]
    float_references: dict[str, Reference]  # the float model's outputs on the calibration inputs
    report: QuantizationReport


def quantize_sources(sources: dict[str, MethodSource], exported: dict[str, ExportedProgram],
                     config: QuantizeConfig,
                     calibration_files: Sequence[str | Path] = ()) -> Quantized:
    """Quantize every method (`exirc.quantize`), calibrated on `calibration_files`
    (or the example inputs)."""
    from exirc.diagnostics.reference import prepare
    from exirc.ir.source import display_path
    from exirc.quantize import quantize_method

    # The float model's outputs, taken before any rewrite.
    references = prepare(sources, calibration_files, what="calibration inputs")
    origins = [display_path(str(f)) for f in calibration_files] or ["example inputs"]
    report = QuantizationReport(config.mode, config.group_size, origins)
    new_sources, new_exported = dict(sources), dict(exported)
    for name, program in exported.items():
        report.float_weight_bytes += _constant_bytes(program)
        source = sources[name]
        calibration = [case.args for case in references[name].cases]
        quantized = quantize_method(program, config, calibration, source.example_inputs,
                                    source.dynamic_shapes, f"method {name!r}")
        new_exported[name] = quantized.program
        new_sources[name] = replace(source, module=quantized.module, exported=None)
        report.quantized_ops += quantized.quantized_ops
        report.weights.extend(quantized.weights)
        report.output_step = max([report.output_step, *output_steps(quantized.module)])
    return Quantized(new_sources, new_exported, references, report)


def measure(result: CompileResult, quantized: Quantized,
            kernels: KernelRegistry | None = None) -> None:
    """Fill the report's stored weight bytes and per-output accuracy from the
    compiled program, run by exirc's runtime on the calibration inputs."""
    from exirc.diagnostics.eager_check import user_outputs
    from exirc.runtime import load
    from exirc.runtime.kernels.registry import KERNELS

    report = quantized.report
    report.weight_bytes = stored_weight_bytes(result)
    program = load(result.data, kernels=kernels or KERNELS, engine="reference")
    worst: dict[tuple[str, int], tuple[float, float, float]] = {}  # signal, noise, max
    for name, reference in quantized.float_references.items():
        method = program.method(name)
        positions = user_outputs(result.planned[name], len(method.output_values))
        for case in reference.cases:
            method.reset_state()
            got = method.run(case.inputs)
            for index, (position, expected) in enumerate(zip(positions, case.expected)):
                if not isinstance(expected, torch.Tensor) or not expected.is_floating_point():
                    continue
                actual = torch.as_tensor(got[position]).to(torch.float64)
                wanted = expected.to(torch.float64)
                signal, noise, largest = worst.get((name, index), (0.0, 0.0, 0.0))
                error = actual - wanted
                worst[(name, index)] = (signal + float(wanted.square().sum()),
                                        noise + float(error.square().sum()),
                                        max(largest, float(error.abs().max())
                                            if error.numel() else 0.0))
    report.accuracy = [OutputAccuracy(name, index, _sqnr(signal, noise), largest)
                       for (name, index), (signal, noise, largest) in worst.items()]


def output_steps(module: torch.fx.GraphModule) -> list[float]:
    """The scale of each output the quantized module dequantizes last (per tensor)."""
    dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    outputs = [n for n in module.graph.nodes if n.op == "output"]
    values = torch.utils._pytree.tree_leaves(outputs[0].args) if outputs else []
    return [float(v.args[1]) for v in values
            if isinstance(v, torch.fx.Node) and v.target == dequantize
            and isinstance(v.args[1], (int, float))]


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _constant_bytes(program: ExportedProgram) -> int:
    """Bytes of the weights a float program stores: the parameters, constant buffers
    and tensor constants its graph reads (not the buffers it updates, which are
    program state, nor weights no node reads)."""
    from exirc.edge.constants import constant_tensor

    total = 0
    for node in program.graph_module.graph.nodes:
        used = node.op == "placeholder" and bool(node.users)
        value = constant_tensor(program, node) if used else None
        if value is not None:
            total += value.numel() * value.element_size()
    return total


def stored_weight_bytes(result: CompileResult) -> int:
    """Bytes of weights in the program: its constant segment (or inline constant
    buffers) and the named data delegates read their weights from (not exirc's
    own metadata, which is named data too, nor named data stored inside the
    constant segment, counted there)."""
    program = result.program
    total = result.report.constant_bytes
    if program.constant_segment is None or not program.segments:
        total += sum(len(b.storage) for b in program.constant_buffer)
    counted: set[int] = set()
    for entry in program.named_data:
        index = entry.segment_index
        if entry.key.startswith("exirc.") or index in counted or \
                not 0 <= index < len(program.segments) or \
                program.segments[index].inside is not None:
            continue
        counted.add(index)
        total += len(program.segments[index].data)
    return total
