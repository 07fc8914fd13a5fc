"""The engines the side-by-side bench runs a model on, behind one interface.

An engine is built once per model (exirc's compile, ExecuTorch's lowering,
the ONNX export: the slow part) and then asked for a runner per thread
count: a call that runs the model on its example inputs and returns the
outputs as a flat list of tensors, in the order eager PyTorch's pytree gives
them. An engine that cannot be built for a model (not installed, the export
fails, the compile fails) raises `EngineUnavailable` with the reason, which
the bench reports in the model's row instead of a time.

Threads: `use_threads(n)` sets them for every engine that has a setting
(torch, so eager and exirc's runtime, which computes with torch; ExecuTorch's
threadpool, which only its XNNPACK delegates use: its portable kernels are
single-threaded whatever it says); onnxruntime takes them per session, in
`OnnxRuntime.runner`. Call it before asking for runners: ExecuTorch's
threadpool is replaced, so a module loaded before must not run after.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from collections.abc import Callable
from typing import Any, Protocol

import torch

from tests.models.zoo import flatten_outputs

Outputs = list[torch.Tensor]
Runner = Callable[[], Outputs]
Inputs = tuple[Any, ...]


class EngineUnavailable(Exception):
    """The engine cannot run this model here; the message says why."""


class Engine(Protocol):
    def runner(self, threads: int) -> Runner: ...


EngineFactory = Callable[[torch.nn.Module, Inputs], Engine]

HAVE_EXECUTORCH = importlib.util.find_spec("executorch") is not None


def use_threads(threads: int) -> None:
    """Every engine with a global setting on `threads` threads."""
    torch.set_num_threads(threads)
    if HAVE_EXECUTORCH:
        from executorch.extension.pybindings import portable_lib

        if portable_lib._threadpool_get_thread_count() != threads:
            portable_lib._unsafe_reset_threadpool(threads)


def first_line(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(error).__name__}: {line}"[:limit]


class Eager:
    """The model itself, as PyTorch runs it (under no_grad, set by the caller)."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs) -> None:
        self.module, self.inputs = module, inputs

    def runner(self, threads: int) -> Runner:
        module, inputs = self.module, self.inputs
        return lambda: flatten_outputs(module(*inputs))


class ExircRun:
    """exirc's compile for one target, run by exirc's own runtime (`exirc run`)."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs, target: str) -> None:
        from exirc.compiler import CompileOptions, compile_module
        from exirc.errors import ExircError
        from exirc.runtime import load

        try:
            data = compile_module(module, inputs, options=CompileOptions(target=target)).data
            self.program = load(data)
        except Exception as error:  # a finding to report, not a reason to stop the bench
            kind = "" if isinstance(error, ExircError) else " (an internal error: a bug)"
            raise EngineUnavailable(
                f"exirc --target {target}{kind}: {first_line(error)}") from error
        self.inputs = list(inputs)

    def runner(self, threads: int) -> Runner:
        method, inputs = self.program.method("forward"), self.inputs
        return lambda: method.run(inputs)


class ExircRunOfExecuTorchFile(ExircRun):
    """ExecuTorch's own XNNPACK-lowered file, run by exirc's runtime: theirs on ours."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs) -> None:
        from exirc.runtime import load

        pte = _executorch_lowering(module, inputs, xnnpack=True)
        try:
            self.program = load(pte)
        except Exception as error:  # a finding: exirc refuses ExecuTorch's file
            raise EngineUnavailable(f"exirc load: {first_line(error)}") from error
        self.inputs = list(inputs)


def exirc_target(target: str) -> EngineFactory:
    """A factory of `ExircRun` engines for `target`."""
    return lambda module, inputs: ExircRun(module, inputs, target)


def _executorch_lowering(module: torch.nn.Module, inputs: Inputs, xnnpack: bool) -> bytes:
    """ExecuTorch's own file of the model, or EngineUnavailable with the reason."""
    if not HAVE_EXECUTORCH:
        raise EngineUnavailable("ExecuTorch is not installed")
    from bench.common import executorch_file

    try:
        return executorch_file(module, inputs, xnnpack=xnnpack)
    except Exception as error:  # ExecuTorch's lowering raises many kinds
        raise EngineUnavailable(f"ExecuTorch lowering: {first_line(error)}") from error


class ExecuTorch:
    """ExecuTorch's own lowering (portable, or with its XNNPACK partitioner),
    run by its runtime's Python bindings."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs, xnnpack: bool) -> None:
        self.pte = _executorch_lowering(module, inputs, xnnpack)
        self.inputs = list(inputs)

    def runner(self, threads: int) -> Runner:
        from tests.oracle import load_with_executorch

        loaded, inputs = load_with_executorch(self.pte), self.inputs
        return lambda: list(loaded.forward(inputs))


def executorch_engine(xnnpack: bool) -> EngineFactory:
    """A factory of `ExecuTorch` engines, portable or XNNPACK-lowered."""
    return lambda module, inputs: ExecuTorch(module, inputs, xnnpack)


class OnnxRuntime:
    """torch.onnx's export, run by an onnxruntime session with `threads` intra-op threads."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs) -> None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as error:
            raise EngineUnavailable(
                "onnxruntime is not installed (pip install '.[bench]')") from error
        try:
            # The exporter reports its progress on stdout; the bench's table is there.
            with contextlib.redirect_stdout(io.StringIO()):
                exported = torch.onnx.export(module, inputs, dynamo=True, verbose=False)
            self.model = exported.model_proto.SerializeToString()
        except Exception as error:  # the exporter raises many kinds
            raise EngineUnavailable(f"ONNX export: {first_line(error)}") from error
        self.feeds_in_order = [t.numpy() for t in inputs]

    def runner(self, threads: int) -> Runner:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            session = onnxruntime.InferenceSession(self.model, options,
                                                   providers=["CPUExecutionProvider"])
        except Exception as error:  # an exported graph ORT refuses
            raise EngineUnavailable(f"onnxruntime session: {first_line(error)}") from error
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(self.feeds_in_order):
            raise EngineUnavailable(f"the ONNX graph takes {len(names)} inputs, "
                                    f"the model {len(self.feeds_in_order)}")
        feeds = dict(zip(names, self.feeds_in_order))
        return lambda: [torch.from_numpy(a) for a in session.run(None, feeds)]
