"""onnxruntime as an engine: XNNPACK delegates and methods' fused chains as sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exirc.errors import UnsupportedOperatorError
from exirc.runtime.delegates.xnnpack.backend import BACKEND_ID
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph
from exirc.runtime.engines.onnx_form import xnnpack_graph
from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.chain import chain_form
from exirc.runtime.engines.onnx_form.chain_form import FusedMethod
from exirc.runtime.engines.onnxruntime.chain import FUSED, OrtChain
from exirc.runtime.engines.onnxruntime.delegate import OnnxDelegate
from exirc.runtime.engines.onnxruntime.session import first_line, onnxruntime_missing
from exirc.runtime.engines.seam import Refusal

if TYPE_CHECKING:
    from exirc.runtime.engines.policy import EnginePolicy
    from exirc.runtime.engines.seam import AcceleratedMethod, MethodView


class OnnxRuntimeEngine:
    name = "onnxruntime"
    runs_delegates = True

    def missing(self) -> str:
        return onnxruntime_missing()

    def prepare_delegate(self, backend_id: str, handle: Any,
                         policy: EnginePolicy) -> OnnxDelegate | Refusal | None:
        """An XNNPACK delegate's compiled graph as one session, where its ONNX form
        maps whole and onnxruntime accepts it."""
        if backend_id != BACKEND_ID or not isinstance(handle, CompiledGraph) or \
                handle.graph is None:
            return None  # not a delegate this engine knows
        try:
            model = xnnpack_graph.to_onnx(handle.graph, handle)
        except NotMapped as reason:
            return self._refuse(policy, str(reason))
        delegate = OnnxDelegate(handle, model.model.SerializeToString(), model.input_names,
                                model.output_names)
        try:
            delegate.session()
        except Exception as error:  # noqa: BLE001 (onnxruntime refusing our model: recorded)
            return self._refuse(policy, f"onnxruntime refused its model: "
                                        f"{type(error).__name__}: {first_line(error)}")
        delegate.artifacts = [("onnx", delegate.model),
                              ("rules.txt", "\n".join(model.rules.lines()).encode())]
        return delegate

    def _refuse(self, policy: EnginePolicy, reason: str) -> Refusal:
        """A refusal, or, when the user asked for this engine by name, an error."""
        if policy.insists_on(self.name):
            raise UnsupportedOperatorError(
                f"{policy.source} asks for onnxruntime, but this XNNPACK delegate cannot "
                f"run on it: {reason}",
                hint="use the auto engine (such delegates then run on the reference "
                     "interpreter), or the reference engine")
        return Refusal(self.name, reason)

    def prepare_method(self, view: MethodView, policy: EnginePolicy
                       ) -> tuple[AcceleratedMethod, str] | Refusal:
        form = chain_form(view)
        if isinstance(form, str):
            return Refusal(self.name, form)
        chain = OrtChain(form)
        try:
            chain.session()
        except Exception as error:  # noqa: BLE001 (onnxruntime refusing it: recorded)
            return Refusal(self.name, f"onnxruntime refused the fused model: "
                                      f"{type(error).__name__}: {first_line(error)}")
        method = FusedMethod(chain, form, view)
        method.artifacts = [("onnx", form.model), ("rules.txt", form.rules_text().encode())]
        return method, FUSED


ONNXRUNTIME_ENGINE = OnnxRuntimeEngine()
