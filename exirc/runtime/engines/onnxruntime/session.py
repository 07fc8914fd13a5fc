"""onnxruntime's sessions, and the one place its private Python API is used.

A session's intra-op thread count is fixed when it is made, so a session is
made per thread count (`session_for_threads`). Inter-op threads are 1 (the
graph runs sequentially). Idle workers spin (ORT's default): measured at 2
threads on a shared 2-core machine, with spinning off resnet_tiny took 0.085 ms
against 0.039, mobilenet_tiny 0.34 against 0.059, vit_tiny 1.15 against 0.38.

`Binding.run` calls the C++ session directly where onnxruntime's Python
wrapper exposes it (`InferenceSession._sess`, `IOBinding._iobinding`): the
wrapper's own per-call checks (WebGPU graph capture) cost a third of a
microsecond and concern no CPU session. `Binding.direct` says whether this
onnxruntime still has them; `tests/runtime/engines/onnxruntime/test_session.py`
fails loudly when a new release drops them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def onnxruntime_missing() -> str:
    """Why onnxruntime cannot run here ("" if it can): both packages must import
    (imported only now: they take ~0.1 s)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # type: ignore[import-untyped,import-not-found,unused-ignore] # noqa: F401
    except ImportError:
        return "onnxruntime or onnx is not installed"
    return ""


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class Binding:
    """A session and the IOBinding its calls run with; `run()` makes one call."""

    def __init__(self, session: Any, binding: Any) -> None:
        self.session, self.binding = session, binding
        inner: Any = getattr(session, "_sess", None)
        handle = getattr(binding, "_iobinding", None)
        self.direct = handle is not None and hasattr(inner, "run_with_iobinding")
        self.run: Callable[[], None]
        if self.direct:
            self.run = functools.partial(inner.run_with_iobinding, handle, None)
        else:
            self.run = functools.partial(session.run_with_iobinding, binding)


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
    import onnxruntime  # type: ignore[import-untyped,import-not-found,unused-ignore]

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(threads, 1)
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")  # see the docstring
    # Fatal only: its warnings are about its own choices, and a run it fails (an index
    # out of range) goes kernel by kernel, which raises exirc's own error.
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(model, sess_options=options,
                                        providers=["CPUExecutionProvider"])
