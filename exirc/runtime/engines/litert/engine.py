"""LiteRT as an engine: a method's fused chain on one LiteRT interpreter (XNNPACK)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exirc.runtime.engines.litert.chain import FUSED_ON_LITERT, litert_chain
from exirc.runtime.engines.litert.interpreter import litert_available
from exirc.runtime.engines.onnx_form.chain import chain_form
from exirc.runtime.engines.onnx_form.chain_form import FusedMethod
from exirc.runtime.engines.seam import Refusal

if TYPE_CHECKING:
    from exirc.runtime.engines.policy import EnginePolicy
    from exirc.runtime.engines.seam import AcceleratedMethod, MethodView


class LiteRtEngine:
    name = "litert"
    runs_delegates = False  # whole chains only

    def missing(self) -> str:
        return "" if litert_available() else "ai-edge-litert is not installed"

    def prepare_delegate(self, backend_id: str, handle: Any, policy: EnginePolicy) -> None:
        """Never asked (`runs_delegates`): LiteRT takes whole chains only."""
        return None

    def prepare_method(self, view: MethodView, policy: EnginePolicy
                       ) -> tuple[AcceleratedMethod, str] | Refusal:
        if not view.plan.delegates:
            return Refusal(self.name, "a chain of kernels alone stays on onnxruntime's "
                                      "exact kernels")
        form = chain_form(view)
        if isinstance(form, str):
            return Refusal(self.name, form)
        chain = litert_chain(form)
        if isinstance(chain, str):
            return Refusal(self.name, chain)
        method = FusedMethod(chain, form, view)
        method.artifacts = [("onnx", form.model), ("tflite", chain.tflite),
                            ("rules.txt", form.rules_text().encode())]
        return method, FUSED_ON_LITERT


LITERT_ENGINE = LiteRtEngine()
