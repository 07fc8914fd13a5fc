"""A fused chain's ONNX form run as one onnxruntime session, bound in place.

Each run reads the caller's checked inputs where they are, binding again only
those that moved (or everything, for a new thread count); outputs land in the
chain's own memory (`onnx_form.chain_form`), bound once and renewed when a
caller still holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exirc.runtime.core.arenas import numpy_dtype
from exirc.runtime.core.inputs import within_storage
from exirc.runtime.engines.onnx_form.chain_form import FLOOR, ChainForm, OutputMemory, renew_held
from exirc.runtime.engines.onnxruntime.session import Binding, session_for_threads

FUSED = "one onnxruntime session (the method's chain, fused at load)"


class OrtChain:
    """Runs a `ChainForm` on onnxruntime; `run` returns False to hand the call back."""

    def __init__(self, form: ChainForm) -> None:
        self.form = form
        self._sessions: dict[int, Any] = {}
        self._binding: Binding | None = None
        self._bound_for = 0  # the thread count `_binding` is for (0: not bound)
        self._bound_inputs: list[int] = []  # addresses bound

    def session(self) -> Any:
        """The session for torch's current thread count (made once per count)."""
        return session_for_threads(self._sessions, self.form.model)

    def run(self, tensors: list[torch.Tensor]) -> bool:
        try:
            if torch.get_num_threads() != self._bound_for or \
                    [t.data_ptr() for t in tensors] != self._bound_inputs:
                if not self._bind_inputs(tensors):
                    return False
            else:
                for tensor in tensors:  # a loop, not all(): this runs every call
                    if not tensor.is_contiguous():  # strides changed in place
                        return False
            assert self._binding is not None
            renew_held(self.form.outputs, self._bind_output)
            self._binding.run()
        except Exception:  # noqa: BLE001 (onnxruntime's errors share no narrower base)
            # onnxruntime refused the call (an index out of range, say): it is handed
            # back, and the kernels, which check every argument, raise exirc's error.
            return False
        return True

    def _bind_inputs(self, tensors: list[torch.Tensor]) -> bool:
        """Bind the run's inputs (and, for a new thread count, all the rest); False
        if one cannot be read in place."""
        if not all(t.is_contiguous() and within_storage(t) for t in tensors):
            return False
        threads = torch.get_num_threads()
        if threads != self._bound_for or self._binding is None:
            self._binding, self._bound_for = self._bind(), threads
        self._bound_inputs = []  # until every input is bound again
        for (name, _), tensor in zip(self.form.inputs, tensors):
            _bind_tensor(self._binding.binding.bind_input, name, tensor)
        self._bound_inputs = [t.data_ptr() for t in tensors]
        return True

    def _bind(self) -> Binding:
        """A binding of the constants and outputs (which never move); inputs come per run."""
        session = self.session()
        binding = Binding(session, session.io_binding())
        for name, tensor in self.form.constants:
            _bind_tensor(binding.binding.bind_input, name, tensor)
        self._binding = binding
        for memory in self.form.outputs.values():
            self._bind_output(memory)
        if self.form.floor is not None:
            _bind_tensor(binding.binding.bind_output, FLOOR, self.form.floor)
        return binding

    def _bind_output(self, memory: OutputMemory) -> None:
        assert self._binding is not None
        tensor = memory.tensor
        self._binding.binding.bind_output(memory.name, "cpu", 0, memory.dtype,
                                          list(tensor.shape), tensor.data_ptr())


def _bind_tensor(bind: Callable[..., None], name: str, tensor: torch.Tensor) -> None:
    bind(name, "cpu", 0, numpy_dtype(tensor.dtype), list(tensor.shape), tensor.data_ptr())
