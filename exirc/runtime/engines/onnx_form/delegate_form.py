"""An XNNPACK delegate's ONNX form as an engine holds it, for a fused chain to take in."""

from __future__ import annotations

from dataclasses import dataclass

from exirc.runtime.delegates.xnnpack.compile import External


@dataclass(frozen=True)
class DelegateForm:
    """The serialized ONNX model computing one delegate, and which argument of the
    DelegateCall each graph input and output is (`External`s, in the same order
    as the names)."""

    model: bytes
    input_names: list[str]
    output_names: list[str]
    inputs: list[External]
    outputs: list[External]
