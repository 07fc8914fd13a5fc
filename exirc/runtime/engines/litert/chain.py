"""A fused chain's ONNX form on LiteRT (XNNPACK), when it has a TFLite form.

A chain of XNNPACK delegates (and the kernels between them) runs on LiteRT
when `ai-edge-litert` is installed and every node of its ONNX form has a
TFLite form (`onnx_to_tflite`); otherwise the onnxruntime engine may take it.
Measured on the bench zoo at 1 thread, LiteRT's XNNPACK kernels and its call
overhead (about 1 us against onnxruntime's 5) make small convolutional models
and MLPs about twice as fast (see docs/running.md).

Not for a chain of kernels alone: those fuse only when onnxruntime computes
each kernel bit for bit as torch does, a promise made per operator for
onnxruntime's kernels, not XNNPACK's.
"""

from __future__ import annotations

import math

import torch

from exirc.runtime.engines.litert.interpreter import LiteRtInterpreters
from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.chain_form import FLOOR, ChainForm, renew_held

FUSED_ON_LITERT = "one LiteRT interpreter on XNNPACK (the method's chain, fused at load)"


class LiteRtChain:
    """Runs a `ChainForm` on LiteRT, which copies the inputs in and the outputs out."""

    def __init__(self, form: ChainForm, interpreters: LiteRtInterpreters,
                 tflite: bytes) -> None:
        self.form, self.interpreters, self.tflite = form, interpreters, tflite

    def run(self, tensors: list[torch.Tensor]) -> bool:
        form = self.form
        try:
            for tensor in tensors:
                if not tensor.is_contiguous():
                    return False
            renew_held(form.outputs)  # copied into: nothing to bind
            outputs = [memory.tensor for memory in form.outputs.values()]
            self.interpreters.run(tensors, outputs if form.floor is None
                                  else [*outputs, form.floor])
        except Exception:  # noqa: BLE001 (LiteRT's errors share no narrower base)
            # LiteRT refused the call (an index out of range, say): it is handed back,
            # and the kernels, which check every argument, raise exirc's error.
            return False
        return True


def litert_chain(form: ChainForm) -> LiteRtChain | str:
    """`form` on LiteRT, or why not (for `execution`)."""
    import onnx

    from exirc.runtime.engines.litert.onnx_to_tflite import to_tflite

    try:
        model = onnx.load_from_string(form.model)
        # Copies: a planned tensor's .numpy() would leave its storage unresizable.
        constants = {name: tensor.detach().clone().numpy() for name, tensor in form.constants}
        converted = to_tflite(model, constants)
    except NotMapped as reason:
        return str(reason)
    except Exception as error:  # noqa: BLE001 (recorded: the refusal's reason)
        return f"writing its TFLite form failed: {type(error).__name__}: {error}"
    outputs = [memory.name for memory in form.outputs.values()]
    if converted.inputs != [name for name, _ in form.inputs] or \
            converted.outputs != outputs + ([FLOOR] if form.floor is not None else []):
        return "its inputs or outputs are not the chain's"
    memory = [m.tensor for m in form.outputs.values()] + (
        [form.floor] if form.floor is not None else [])
    if [t.numel() * t.element_size() for t in memory] != [
            math.prod(shape) * dtype.itemsize for shape, dtype in converted.output_types]:
        return "its outputs are not the size of the chain's"
    interpreters = LiteRtInterpreters(converted.data, converted.input_types,
                                      converted.output_types)
    try:
        interpreters.runner()
    except Exception as error:  # noqa: BLE001 (LiteRT refusing the model: recorded)
        return f"LiteRT refused the model: {type(error).__name__}: {error}"
    return LiteRtChain(form, interpreters, converted.data)
