"""An XNNPACK delegate on onnxruntime: the same checked graph as one session.

The onnxruntime engine (`engine`) offers each XNNPACK delegate's compiled graph
to the ONNX form (`onnx_form.xnnpack_graph.to_onnx`); where it maps whole and
onnxruntime accepts the model, the delegate runs as an `OnnxDelegate`.

`OnnxDelegate.execute` binds the delegate's tensors to the session by pointer
(ORT's IOBinding: no copies in or out) when they are exactly what the model
declares: contiguous float32 of its static dims, outputs not overlapping
inputs. Any call that is not (a dynamic batch, a wrong dtype) goes to the
reference path (exirc's XNNPACK executor on torch), which handles it or raises
the InputError it always raised.

Threads: see `session.new_session`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from exirc.errors import ExircError, InputError
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph, External
from exirc.runtime.delegates.xnnpack.run import execute as execute_on_reference
from exirc.runtime.engines.onnx_form.delegate_form import DelegateForm
from exirc.runtime.engines.onnxruntime.session import Binding, first_line, session_for_threads

_FLOAT32 = numpy.float32


@dataclass
class OnnxDelegate:
    """A delegate handle running on onnxruntime; `fallback` is the reference path
    over the same graph, for calls the static model does not fit."""

    fallback: CompiledGraph
    model: bytes
    input_names: list[str]
    output_names: list[str]
    artifacts: list[tuple[str, bytes]] = field(default_factory=list)  # for --dump-engine
    _sessions: dict[int, Any] = field(default_factory=dict)
    # The last call's binding and what it was made for (thread count, addresses):
    # a method's planned memory gives the same addresses call after call, and a
    # reused binding saves ~8 us a call against binding afresh.
    _binding: Any = None
    _bound_for: tuple[int, ...] = ()
    # The last call that passed `_bind`, for `_same_as_last` (its thread count is
    # `_bound_for[0]`): its arguments, and the tensors bound with their addresses
    # and shapes then (the addresses repeat `_bound_for`'s, kept per tensor so the
    # per-call check walks one list).
    _last_args: tuple[Any, ...] | None = None
    _last_bound: list[tuple[torch.Tensor, int, torch.Size]] = field(default_factory=list)

    @property
    def inputs(self) -> list[External]:
        """The delegate's input arguments, as the torch path's handle lists them."""
        return self.fallback.inputs

    @property
    def outputs(self) -> list[External]:
        return self.fallback.outputs

    @property
    def onnx_form(self) -> DelegateForm:
        """The ONNX form it runs, for a fused chain that takes the delegate in."""
        return DelegateForm(self.model, self.input_names, self.output_names,
                            self.inputs, self.outputs)

    def session(self) -> Any:
        """The session for torch's current thread count (made once per count)."""
        return session_for_threads(self._sessions, self.model)

    def release(self) -> None:
        """Free the sessions (and their weights); the next call makes one again."""
        self._sessions.clear()
        self._binding, self._bound_for, self._last_args = None, (), None

    def execute(self, args: list[Any]) -> None:
        """Run on the DelegateCall's arguments (inputs, then outputs written in place)."""
        if not self._same_as_last(args):
            graph = self.fallback
            bound = _bind(graph, args)
            if bound is None:
                self._last_args = None
                execute_on_reference(graph, args)
                return
            key = (torch.get_num_threads(), *(t.data_ptr() for t in bound))
            if key != self._bound_for:
                self._binding, self._bound_for = self._new_binding(bound), key
            self._last_args = tuple(args)
            self._last_bound = [(t, t.data_ptr(), t.shape) for t in bound]
        try:
            self._binding.run()
        except ExircError:
            raise
        except Exception as error:  # noqa: BLE001 (ORT's own checks: the call's fault)
            raise InputError(f"the XNNPACK delegate failed on onnxruntime: "
                             f"{type(error).__name__}: {first_line(error)}",
                             hint="run it on the reference interpreter: `exirc run --engine "
                                  "reference`, or load(..., engine='reference')") from error

    def _same_as_last(self, args: list[Any]) -> bool:
        """Whether `args` are the last call's tensors, unmoved and unresized, at the
        same thread count: then everything `_bind` checked still holds (a tensor's
        dtype and device never change in place; a resize or a new storage shows in
        its shape or address, and a contiguous tensor of unchanged shape is checked
        as still contiguous) and the binding made for them is reused. A method's
        DelegateCall passes the same tensors every call, so this costs ~0.3 us a
        tensor against ~2 us for `_bind`."""
        last = self._last_args
        if last is None or torch.get_num_threads() != self._bound_for[0]:
            return False
        # Element by element: a caller may have changed the list in place.
        if len(args) != len(last) or not all(map(operator.is_, args, last)):
            return False
        return all(t.data_ptr() == address and t.shape == shape and t.is_contiguous()
                   for t, address, shape in self._last_bound)

    def _new_binding(self, tensors: list[torch.Tensor]) -> Binding:
        """ORT's IOBinding of the (checked) tensors, in argument order: inputs then outputs."""
        session, graph = self.session(), self.fallback
        binding = session.io_binding()
        count = len(graph.inputs)
        # Shapes as declared: a 0-d tensor is bound as XNNPACK's [1] (same 4 bytes).
        for name, external, tensor in zip(self.input_names, graph.inputs, tensors[:count]):
            binding.bind_input(name, "cpu", 0, _FLOAT32, external.dims, tensor.data_ptr())
        for name, external, tensor in zip(self.output_names, graph.outputs, tensors[count:]):
            binding.bind_output(name, "cpu", 0, _FLOAT32, external.dims, tensor.data_ptr())
        return Binding(session, binding)


def _bind(graph: CompiledGraph, args: list[Any]) -> list[torch.Tensor] | None:
    """The inputs then the outputs, as tensors ORT may read and write in place, or
    None when the call is not exactly what the model declares (the torch path takes it)."""
    if len(args) != graph.num_args:
        return None
    inputs = []
    for external in graph.inputs:
        arg = args[external.arg]
        if not _plain(arg, external.dims):
            return None
        inputs.append(arg)
    outputs = []
    for external in graph.outputs:
        arg = args[external.arg]
        if not isinstance(arg, torch.Tensor) or arg.dtype != torch.float32:
            return None
        if tuple(arg.shape) != external.dims and not (arg.dim() == 0
                                                      and external.dims == (1,)):
            arg.resize_(external.dims)  # as the torch path does before writing
        if not _plain(arg, external.dims):
            return None
        outputs.append(arg)
    if _overlap(inputs, outputs):
        return None
    return inputs + outputs


def _plain(arg: Any, dims: tuple[int, ...]) -> bool:
    """A contiguous float32 CPU tensor of `dims` (a 0-d one for XNNPACK's [1] scalar)."""
    return (isinstance(arg, torch.Tensor) and arg.dtype == torch.float32
            and arg.device.type == "cpu" and arg.is_contiguous() and not arg.requires_grad
            and (tuple(arg.shape) == dims or (arg.dim() == 0 and dims == (1,))))


def _overlap(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> bool:
    """Whether an output's bytes meet an input's or another output's (ORT would read
    or overwrite what it wrote; the torch path computes everything before writing)."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * 4) for t in outputs]
    for i, (start, end) in enumerate(spans):
        others = [(t.data_ptr(), t.data_ptr() + t.numel() * 4) for t in inputs] + spans[i + 1:]
        if any(start < b and a < end for a, b in others):
            return True
    return False
