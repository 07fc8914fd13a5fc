"""What `exirc compile --quantize` prints: the weight bytes saved, and the accuracy
against the float model (on --verify-inputs when given, else the calibration
inputs), an output under --min-sqnr marked."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from exirc.inspector.render import human_bytes

if TYPE_CHECKING:  # importing it imports torch, which `exirc --help` must not
    from exirc.diagnostics.quantization import QuantizationReport


def quantization_lines(report: QuantizationReport) -> list[str]:
    parts = []
    if report.quantized_ops:
        count = report.quantized_ops
        parts.append(f"{count} conv/linear layer{'s' if count != 1 else ''}")
    if report.weights:
        groups = sorted({w.group_size for w in report.weights})
        parts.append(f"{len(report.weights)} weight table{'s' if len(report.weights) != 1 else ''}"
                     f" (group size {', '.join(map(str, groups))})")
    what = " and ".join(parts)
    calibrated = f"calibrated on {', '.join(report.calibration)}; " \
        if report.mode == "int8" else ""
    measured = ", ".join(report.measured_on)
    if report.mode == "int8" and report.measured_on == report.calibration:
        measured += " (the inputs calibrated on: --verify-inputs measures on others)"
    lines = [
        f"  quantized {report.mode}: {what}, {calibrated}accuracy measured on {measured}",
        f"  weights {human_bytes(report.float_weight_bytes)} float -> "
        f"{human_bytes(report.weight_bytes)} stored ({report.weight_ratio:.2f}x)",
    ]
    for accuracy in report.accuracy:
        sqnr = "exact" if math.isinf(accuracy.sqnr_db) and accuracy.sqnr_db > 0 else \
            f"SQNR {accuracy.sqnr_db:.1f} dB"
        below = f" -- BELOW {report.min_sqnr_db:g} dB" if accuracy.below_minimum else ""
        lines.append(f"  accuracy vs float, {accuracy.method} output {accuracy.output}: {sqnr}, "
                     f"max abs error {accuracy.max_abs_error:.3g}{below}")
    return lines
