"""What static int8 may be calibrated on: a model that takes positions or a
cache is not measured by one call.

Static int8 fixes every activation's range from the calibration inputs. The
example inputs of a decoder are one token at position 0: the rotary tables,
the attention mask and the cache reads then get the ranges of position 0 and
are wrong at every later one, and an accuracy measured on those same inputs
cannot see it. So `--quantize int8` without `--calibration-inputs`:

- refuses (`CalibrationError`) a model that takes positions or a cache, and
  names the modes that quantize activations as they come (`8da4w`, `8da8w`:
  dynamic, nothing to calibrate), or calibration files to give instead;
- warns for any other model: ranges fit the example inputs alone.

The rule, per captured method (`position_or_cache`), either of:

- the method writes a buffer or tensor constant (program state: a KV cache, a
  position counter; `exirc.ir.state.written_inputs`);
- one of its inputs is named like a position or a cache: a `_`-separated part
  of the name is `pos`, `position`, `positions`, `cache` or `past` (`input_pos`,
  `cache_position`, `position_ids`, `start_pos`, `k_cache`, `past_key_values_0`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exirc.errors import UsageError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

# Parts of an input's name that make it a position or a cache.
POSITION_OR_CACHE_WORDS = frozenset({"pos", "position", "positions", "cache", "past"})

DYNAMIC_MODES = ("8da4w", "8da8w")  # activations quantized per call: no calibration


class CalibrationError(UsageError):
    """Static int8 would be calibrated on inputs that cannot represent the model's use."""

    code = "E0203"
    default_hint = (f"quantize with --quantize {' or '.join(DYNAMIC_MODES)} (activations "
                    "quantized as they come: nothing to calibrate); to keep static int8, "
                    "give --calibration-inputs FILE.npz (repeatable) with inputs at the "
                    "positions and cache contents the model will see")


def position_or_cache(program: ExportedProgram) -> str | None:
    """Why `program` takes positions or a cache (a phrase), or None (the rule above)."""
    from torch.export.graph_signature import InputKind

    from exirc.ir.state import written_inputs

    written = written_inputs(program)
    if written:
        names = [str(spec.target or spec.arg.name)
                 for spec in program.graph_signature.input_specs
                 if getattr(spec.arg, "name", None) in written]
        return (f"it writes {len(names)} buffer{'s' if len(names) != 1 else ''} "
                f"({names[0]}{', ...' if len(names) > 1 else ''})")
    for spec in program.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if spec.kind == InputKind.USER_INPUT and name and \
                POSITION_OR_CACHE_WORDS & set(name.lower().split("_")):
            return f"it takes an input named {name!r}"
    return None


def check_calibration(programs: dict[str, ExportedProgram], calibration_files: int,
                      accuracy_files: int = 0) -> str | None:
    """For `--quantize int8`: raise CalibrationError for example-input-only
    calibration of a model that takes positions or a cache; return a warning
    for other example-input-only calibration; None when files were given."""
    if calibration_files:
        return None
    for name, program in programs.items():
        reason = position_or_cache(program)
        if reason is not None:
            raise CalibrationError(
                f"method {name!r} takes positions or a cache: {reason}; static int8 "
                "calibrated on the example inputs alone (one call, one position) fixes "
                "activation ranges that are wrong at every other position, and an "
                "accuracy measured on the same inputs would not show it")
    measured = "" if accuracy_files else ", and the accuracy below is measured on them too"
    return ("--quantize int8 is calibrated on the example inputs alone: activation ranges "
            f"fit those inputs only{measured}; give representative --calibration-inputs"
            + ("" if accuracy_files else " (and held-out --verify-inputs to measure on)"))
