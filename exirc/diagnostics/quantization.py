"""`--quantize`: quantize captured methods, and say what it cost and saved.

The stage itself is `exirc.quantize`; this module feeds it calibration inputs
(the `.npz` files of `--calibration-inputs`, in `--verify-inputs`' format, or
the example inputs), keeps the float model's outputs on them, and after the
compile runs the program on the same inputs to report its accuracy against
the float model: SQNR (signal-to-quantization-noise ratio, in dB; higher is
better, 20 dB is about 10% relative error, 40 dB 1%) and the largest
absolute error, per output. It also reports the weight bytes before and after,
each weight once however many methods read it.

Accuracy is measured on the `--verify-inputs` files when given (inputs the
calibration did not see), else on the calibration inputs. An output whose
SQNR falls below `min_sqnr_db` (default 20 dB, `--min-sqnr`) is a warning, as
is static int8 calibrated on the example inputs alone; a model that takes
positions or a cache is refused that (`exirc.quantize.calibration`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from exirc.capture import MethodSource
    from exirc.compiler import CompileOptions, CompileResult
    from exirc.diagnostics.reference import Reference
    from exirc.quantize import QuantizeConfig
    from exirc.quantize.weight_only import QuantizedWeight
    from exirc.runtime.kernels.registry import KernelRegistry


DEFAULT_MIN_SQNR_DB = 20.0  # about 10% relative error: below it, an output is damaged


class AccuracyWarning(UserWarning):
    """A quantized program measured (or calibrated) in a way that hides its error,
    or measured far from the float model (the API's form of the CLI's warnings)."""


@dataclass(frozen=True)
class OutputAccuracy:
    method: str
    output: int
    sqnr_db: float  # inf when the program reproduces the float output exactly
    max_abs_error: float
    below_minimum: bool = False  # SQNR under the report's min_sqnr_db


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
    measured_on: list[str] = field(default_factory=list)  # the accuracy's inputs
    min_sqnr_db: float = DEFAULT_MIN_SQNR_DB
    warnings: list[str] = field(default_factory=list)  # also told as the compile runs

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
            "measured_on": self.measured_on, "min_sqnr_db": self.min_sqnr_db,
            "accuracy": [{"method": a.method, "output": a.output,
                          "sqnr_db": None if math.isinf(a.sqnr_db) else round(a.sqnr_db, 2),
                          "max_abs_error": a.max_abs_error,
                          "below_min_sqnr": a.below_minimum} for a in self.accuracy],
            "warnings": self.warnings,
        }


@dataclass
class Quantized:
    """The quantized methods, ready for the pipeline, and the float references."""

    sources: dict[str, MethodSource]  # each with the quantized module as its model
    exported: dict[str, ExportedProgram]
    # The float model's outputs on the inputs accuracy is measured on: the
    # --verify-inputs files, else the calibration inputs
    float_references: dict[str, Reference]
    report: QuantizationReport
    warn: Callable[[str], None] | None = None  # None: warnings.warn, as AccuracyWarning
    told: list[str] = field(default_factory=list)  # the report's warnings told so far

    def tell(self) -> None:
        """Tell the report's warnings not told yet, each once, as they arise."""
        for message in self.report.warnings[len(self.told):]:
            self.told.append(message)
            if self.warn is not None:
                self.warn(message)
            else:
                warnings.warn(message, AccuracyWarning, stacklevel=5)


def quantize_with(options: CompileOptions, sources: dict[str, MethodSource],
                  exported: dict[str, ExportedProgram],
                  warn: Callable[[str], None] | None = None) -> Quantized:
    """`quantize_sources` as the compile options (`options.quantize`, ...) ask."""
    from exirc.backend.delegate import Delegate
    from exirc.pipelines import load_pipeline
    from exirc.quantize import QuantizeConfig, default_embeddings

    embeddings = options.quantize_embeddings
    if embeddings is None:
        stages = load_pipeline(options.target, options.pipeline).stages.values()
        delegated = any(isinstance(p, Delegate) for passes in stages for p in passes)
        embeddings = default_embeddings(options.quantize or "", delegated)
    config = QuantizeConfig(options.quantize or "", options.quantize_group_size, embeddings)
    return quantize_sources(sources, exported, config, options.calibration_inputs,
                            options.verify_inputs, options.min_sqnr_db, warn)


def quantize_sources(sources: dict[str, MethodSource], exported: dict[str, ExportedProgram],
                     config: QuantizeConfig,
                     calibration_files: Sequence[str | Path] = (),
                     accuracy_files: Sequence[str | Path] = (),
                     min_sqnr_db: float | None = None,
                     warn: Callable[[str], None] | None = None) -> Quantized:
    """Quantize every method (`exirc.quantize`), calibrated on `calibration_files`
    (or the example inputs); accuracy is to be measured on `accuracy_files` (or
    the calibration inputs). CalibrationError for static int8 that only the
    example inputs would calibrate, on a model taking positions or a cache.
    Warnings go to `warn` as they arise (default: `warnings.warn`)."""
    from exirc.diagnostics.reference import prepare
    from exirc.ir.source import display_path
    from exirc.quantize import quantize_method
    from exirc.quantize.calibration import check_calibration

    warning = check_calibration(exported, len(calibration_files), len(accuracy_files)) \
        if config.mode == "int8" else None
    # The float model's outputs, taken before any rewrite.
    references = prepare(sources, calibration_files, what="calibration inputs")
    origins = [display_path(str(f)) for f in calibration_files] or ["example inputs"]
    measured = prepare(sources, accuracy_files) if accuracy_files else references
    report = QuantizationReport(
        config.mode, config.group_size, origins,
        measured_on=[display_path(str(f)) for f in accuracy_files] or list(origins),
        min_sqnr_db=DEFAULT_MIN_SQNR_DB if min_sqnr_db is None else min_sqnr_db)
    quantized = Quantized(dict(sources), dict(exported), measured, report, warn)
    if warning is not None:
        report.warnings.append(warning)
        quantized.tell()
    new_sources, new_exported = quantized.sources, quantized.exported
    # Methods of one model share its weights: each is counted once, by content,
    # as the program stores it (`exirc.emit.constants`).
    float_weights: dict[str, int] = {}
    layers: set[str] = set()
    weights: dict[tuple[str, tuple[int, ...], int, str], QuantizedWeight] = {}
    for name, program in exported.items():
        float_weights.update(_constant_weights(program))
        source = sources[name]
        calibration = [case.args for case in references[name].cases]
        method = quantize_method(program, config, calibration, source.example_inputs,
                                 source.dynamic_shapes, f"method {name!r}")
        new_exported[name] = method.program
        new_sources[name] = replace(source, module=method.module, exported=None)
        if method.layers:
            layers.update(method.layers)
        else:
            report.quantized_ops += method.quantized_ops
        for weight in method.weights:
            weights.setdefault((weight.name, weight.shape, weight.group_size, weight.digest),
                               weight)
        report.output_step = max([report.output_step, *output_steps(method.module)])
    report.float_weight_bytes = sum(float_weights.values())
    report.quantized_ops += len(layers)
    report.weights = list(weights.values())
    return quantized


def measure(result: CompileResult, quantized: Quantized,
            kernels: KernelRegistry | None = None) -> None:
    """`_measure`, then the result's quantization report, quantized modules (per
    method, what --verify compares with) and warnings, told as they arise."""
    _measure(result, quantized, kernels)
    result.quantization = quantized.report
    result.quantized_modules = {name: source.module for name, source
                                in quantized.sources.items() if source.module is not None}
    quantized.tell()
    result.warnings = list(quantized.told)


def _measure(result: CompileResult, quantized: Quantized,
             kernels: KernelRegistry | None = None) -> None:
    """Fill the report's stored weight bytes and per-output accuracy from the
    compiled program, run by exirc's runtime on the inputs `quantize_sources` took
    the float outputs of; outputs under the minimum SQNR add warnings."""
    from exirc.diagnostics.eager_check import user_outputs
    from exirc.runtime import load
    from exirc.runtime.kernels.registry import KERNELS

    report = quantized.report
    report.weight_bytes = stored_weight_bytes(result)
    program = load(result.data, data=result.external_data, kernels=kernels or KERNELS,
                   engine="reference")
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
    report.accuracy = [OutputAccuracy(name, index, sqnr, largest, sqnr < report.min_sqnr_db)
                       for (name, index), (signal, noise, largest) in worst.items()
                       for sqnr in [_sqnr(signal, noise)]]
    on = ", ".join(report.measured_on)
    for accuracy in report.accuracy:
        if accuracy.below_minimum:
            report.warnings.append(
                f"method {accuracy.method!r} output {accuracy.output}: SQNR "
                f"{accuracy.sqnr_db:.1f} dB against the float model on {on}, below "
                f"{report.min_sqnr_db:g} dB (--min-sqnr): --quantize {report.mode} damaged "
                f"it; {_ADVICE.get(report.mode, _ADVICE['int8'])}")


_ADVICE = {
    "int8": "try --quantize 8da8w or 8da4w (activations quantized per call) or a weight-only "
            "mode, or calibrate on more representative --calibration-inputs",
    "int4-weight-only": "try a smaller --group-size, or int8-weight-only",
    "int8-weight-only": "try a smaller --group-size",
    "8da4w": "try a smaller --group-size, or 8da8w",
    "8da8w": "try a weight-only mode (activations stay float)",
}


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


def _constant_weights(program: ExportedProgram) -> dict[str, int]:
    """The weights a float program stores, by content (`content_digest`) -> bytes:
    the parameters, constant buffers and tensor constants its graph reads (not the
    buffers it updates, which are program state, nor weights no node reads)."""
    from exirc.edge.constants import constant_tensor
    from exirc.ir.content import content_digest
    from exirc.ir.state import written_inputs

    state = written_inputs(program)
    found = {}
    for node in program.graph_module.graph.nodes:
        used = node.op == "placeholder" and bool(node.users) and node.name not in state
        value = constant_tensor(program, node) if used else None
        if value is not None:
            found[content_digest(value)] = value.numel() * value.element_size()
    return found


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
    return total + len(result.external_data or b"")  # weights kept beside the program
