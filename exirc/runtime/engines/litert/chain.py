"""Choosing LiteRT (XNNPACK) over onnxruntime for a fused chain, at load.

A chain of XNNPACK delegates (and the kernels between them) runs on LiteRT
when `ai-edge-litert` is installed and every node of its ONNX form has a
TFLite form (`onnx_to_tflite`); otherwise on onnxruntime, as before. Measured
on the bench zoo at 1 thread, LiteRT's XNNPACK kernels and its call overhead
(about 1 us against onnxruntime's 5) make small convolutional models and MLPs
about twice as fast (see the README).

Not chosen for a chain of kernels alone: those fuse only when onnxruntime
computes each kernel bit for bit as torch does, a promise made per operator
for onnxruntime's kernels, not XNNPACK's.

EXIRC_XNNPACK_ENGINE=onnxruntime keeps every chain on onnxruntime; =litert
requires the package (a UsageError without it) and otherwise behaves as auto.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from exirc.errors import UsageError
from exirc.runtime.engines.litert.engine import LiteRtChain, litert_available
from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnxruntime.chain import FLOOR
from exirc.runtime.engines.onnxruntime.delegate import ENGINE_VARIABLE, requested_engine

if TYPE_CHECKING:
    from exirc.runtime.engines.onnxruntime.chain import FusedChain

LITERT_HINT = "install it with `pip install 'exirc[litert]'`"


def litert_form(chain: FusedChain, has_delegates: bool) -> tuple[LiteRtChain | None, str]:
    """`chain` on LiteRT, or None and why not (for `execution`)."""
    engine = requested_engine()
    if engine == "litert" and not litert_available():
        raise UsageError(f"{ENGINE_VARIABLE}=litert, but ai-edge-litert is not installed",
                         hint=f"{LITERT_HINT}, or unset {ENGINE_VARIABLE}")
    if engine in ("onnxruntime", "torch"):
        return None, f"{ENGINE_VARIABLE}={engine}"
    if not litert_available():
        return None, "ai-edge-litert is not installed"
    if not has_delegates:
        return None, "a chain of kernels alone stays on onnxruntime's exact kernels"
    import onnx

    from exirc.runtime.engines.litert.onnx_to_tflite import to_tflite

    try:
        model = onnx.load_from_string(chain.model)
        # Copies: a planned tensor's .numpy() would leave its storage unresizable.
        constants = {name: tensor.detach().clone().numpy() for name, tensor in chain.constants}
        converted = to_tflite(model, constants)
    except NotMapped as reason:
        return None, str(reason)
    except Exception as error:  # noqa: BLE001 (a model no translator foresaw: onnxruntime's)
        return None, f"writing its TFLite form failed: {type(error).__name__}: {error}"
    outputs = [memory.name for memory in chain.outputs.values()]
    if converted.inputs != [name for name, _ in chain.inputs] or \
            converted.outputs != outputs + ([FLOOR] if chain.floor is not None else []):
        return None, "its inputs or outputs are not the chain's"
    memory = [m.tensor for m in chain.outputs.values()] + (
        [chain.floor] if chain.floor is not None else [])
    if [t.numel() * t.element_size() for t in memory] != [
            math.prod(shape) * dtype.itemsize for shape, dtype in converted.output_types]:
        return None, "its outputs are not the size of the chain's"
    litert = LiteRtChain(converted.data, converted.input_types, converted.output_types)
    try:
        litert.runner()
    except Exception as error:  # noqa: BLE001 (LiteRT refusing the model: stay on onnxruntime)
        return None, f"LiteRT refused the model: {type(error).__name__}: {error}"
    return litert, ""
