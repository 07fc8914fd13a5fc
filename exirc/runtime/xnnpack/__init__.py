"""exirc's XNNPACK backend: runs ExecuTorch's `XnnpackBackend` delegates with torch.

A program lowered with ExecuTorch's XnnpackPartitioner (or exirc's) hands
parts of its graph to XNNPACK as a delegate blob. This package reads such a
blob, checks it, and compiles it into torch calls with XNNPACK's float32
semantics, so that `exirc run` gives what ExecuTorch's runtime gives.

    backend.py      the Backend (init, execute) and its default registration
    compile.py      the graph as a list of closures, checked at init
    run.py          execute: binding arguments, running, writing outputs
    constants.py    datatypes, and weights resolved to tensors once
    context.py      what a node builder sees: its values, checked
    elementwise.py, linear.py, pooling.py, shapes.py, attention.py, convert.py
                    the node kinds, by family

Importing the package registers the backend in the default registry (unless
a backend is already registered under its id): the loader imports it.
"""

from __future__ import annotations

from exirc.runtime.delegates import BACKENDS
from exirc.runtime.xnnpack.backend import BACKEND_ID, XnnpackBackend, register

register(BACKENDS)

__all__ = ["BACKEND_ID", "XnnpackBackend", "register"]
