"""Running an XNNPACK delegate on onnxruntime, and choosing between it and torch.

`choose_engine` runs at init, after the torch path compiled (and so checked)
the graph. The environment variable EXIRC_XNNPACK_ENGINE picks the engine:

    unset, "" or "auto"   onnxruntime when `onnxruntime` and `onnx` import and
                          `onnx_graph.to_onnx` maps the whole delegate; else torch
    "torch"               always the torch path
    "onnxruntime"         always onnxruntime; a UsageError when it is not
                          installed, an UnsupportedOperatorError naming the node
                          for a delegate it cannot take; fused chains stay off
                          LiteRT
    "litert"              as auto, but fused chains need LiteRT installed
                          (exirc.runtime.engines.litert.chain)

`OnnxDelegate.execute` binds the delegate's tensors to the session by pointer
(ORT's IOBinding: no copies in or out) when they are exactly what the model
declares: contiguous float32 of its static dims, outputs not overlapping
inputs. Any call that is not (a dynamic batch, a wrong dtype) goes to the torch
path, which handles it or raises the InputError it always raised.

Threads: a session's intra-op thread count is fixed when it is created, so a
session is made for torch's thread count at init and, should a call find
torch set to another count (`exirc run --threads`), once more for that count.
Inter-op threads are 1 (the graph runs sequentially). Idle workers spin
(ORT's default): measured at 2 threads on a shared 2-core machine, with
spinning off resnet_tiny took 0.085 ms against 0.039, mobilenet_tiny 0.34
against 0.059, vit_tiny 1.15 against 0.38 (bench zoo, --target xnnpack).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exirc.errors import ExircError, InputError, UnsupportedOperatorError, UsageError
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph, External
from exirc.runtime.delegates.xnnpack.run import execute as execute_on_torch
from exirc.serialize.xnnpack import graph as G

ENGINE_VARIABLE = "EXIRC_XNNPACK_ENGINE"
ENGINES = ("auto", "torch", "onnxruntime", "litert")
INSTALL_HINT = "install the optional engine with `pip install 'exirc[ort]'`"


def requested_engine() -> str:
    """The engine EXIRC_XNNPACK_ENGINE asks for ("auto" when unset or empty)."""
    value = os.environ.get(ENGINE_VARIABLE, "").strip().lower() or "auto"
    if value not in ENGINES:
        raise UsageError(f"{ENGINE_VARIABLE}={os.environ[ENGINE_VARIABLE]!r} is not an "
                         "XNNPACK engine",
                         hint=f"set it to one of {', '.join(ENGINES)}, or unset it")
    return value


def onnxruntime_available() -> bool:
    """Whether both optional packages import (imported only now: they take ~0.1 s)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # type: ignore[import-untyped,import-not-found,unused-ignore] # noqa: F401
    except ImportError:
        return False
    return True


def choose_engine(graph: G.XNNGraph, compiled: CompiledGraph) -> CompiledGraph | OnnxDelegate:
    """The handle the delegate runs with: `compiled` itself (the torch path) or an
    onnxruntime session over the same checked graph (see the module docstring)."""
    engine = requested_engine()
    if engine == "torch":
        return dataclasses.replace(compiled, not_on_onnxruntime=f"{ENGINE_VARIABLE}=torch")
    if not onnxruntime_available():
        if engine == "onnxruntime":
            raise UsageError(f"{ENGINE_VARIABLE}=onnxruntime, but onnxruntime or onnx is not "
                             "installed", hint=f"{INSTALL_HINT}, or unset {ENGINE_VARIABLE}")
        return dataclasses.replace(compiled, not_on_onnxruntime="onnxruntime is not installed")
    from exirc.runtime.engines.onnx_form.builder import NotMapped
    from exirc.runtime.engines.onnx_form.xnnpack_graph import to_onnx

    try:
        model = to_onnx(graph, compiled)
    except NotMapped as reason:
        if engine == "onnxruntime":
            raise UnsupportedOperatorError(
                f"{ENGINE_VARIABLE}=onnxruntime, but this XNNPACK delegate cannot run on "
                f"onnxruntime: {reason}",
                hint=f"unset {ENGINE_VARIABLE} (such delegates then run on torch), or set it "
                     "to torch") from None
        return dataclasses.replace(compiled, not_on_onnxruntime=str(reason))
    delegate = OnnxDelegate(compiled, model.model.SerializeToString(), model.input_names,
                            model.output_names)
    try:
        delegate.session()
    except Exception as error:  # noqa: BLE001 (onnxruntime refusing our model: keep torch)
        if engine == "onnxruntime":
            raise UnsupportedOperatorError(
                f"{ENGINE_VARIABLE}=onnxruntime, but onnxruntime refused this XNNPACK "
                f"delegate: {type(error).__name__}: {_first_line(error)}",
                hint=f"unset {ENGINE_VARIABLE} (such delegates then run on torch)") from None
        return dataclasses.replace(compiled, not_on_onnxruntime="onnxruntime refused its model: "
                                   f"{type(error).__name__}")
    return delegate


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@dataclass
class OnnxDelegate:
    """A delegate handle running on onnxruntime; `fallback` is the torch path over
    the same graph, for calls the static model does not fit."""

    fallback: CompiledGraph
    model: bytes
    input_names: list[str]
    output_names: list[str]
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

    def session(self) -> Any:
        """The session for torch's current thread count (made once per count)."""
        return session_for_threads(self._sessions, self.model)

    def drop_sessions(self) -> None:
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
                execute_on_torch(graph, args)
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
                             f"{type(error).__name__}: {_first_line(error)}",
                             hint=f"set {ENGINE_VARIABLE}=torch to run it on torch") from error

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


class Binding:
    """A session and the IOBinding its calls run with; `run()` makes one call."""

    def __init__(self, session: Any, binding: Any) -> None:
        self.session, self.binding = session, binding
        # The C++ call itself where onnxruntime's Python wrapper shows it: the
        # wrapper's own per-call checks (WebGPU graph capture) cost a third of a
        # microsecond and concern no CPU session.
        inner = getattr(session, "_sess", None)
        handle = getattr(binding, "_iobinding", None)
        self.run: Callable[[], None]
        if inner is not None and handle is not None and hasattr(inner, "run_with_iobinding"):
            self.run = functools.partial(inner.run_with_iobinding, handle, None)
        else:
            self.run = functools.partial(session.run_with_iobinding, binding)


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


_FLOAT32: Any = None  # numpy.float32, set when onnxruntime is first used


def session_for_threads(sessions: dict[int, Any], model: bytes) -> Any:
    """`model`'s session for torch's current thread count, made once per count into
    `sessions` (a session's intra-op thread count is fixed when it is made)."""
    threads = torch.get_num_threads()
    session = sessions.get(threads)
    if session is None:
        session = sessions[threads] = new_session(model, threads)
    return session


def new_session(model: bytes, threads: int) -> Any:
    """An onnxruntime CPU session over `model` with `threads` intra-op threads."""
    global _FLOAT32
    import numpy
    import onnxruntime  # type: ignore[import-untyped,import-not-found,unused-ignore]

    _FLOAT32 = numpy.float32
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(threads, 1)
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")  # see above
    # Fatal only: its warnings are about its own choices, and a run it fails (an index
    # out of range) goes kernel by kernel, which raises exirc's own error.
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(model, sess_options=options,
                                        providers=["CPUExecutionProvider"])
