"""exirc's XNNPACK backend: runs ExecuTorch's `XnnpackBackend` delegates with torch.

A program lowered with ExecuTorch's XnnpackPartitioner (or exirc's) hands
parts of its graph to XNNPACK as a delegate blob. This package reads such a
blob, checks it, and compiles it into torch calls with XNNPACK's semantics,
so that `exirc run` gives what ExecuTorch's runtime gives: float32 exactly
(fp16 and bf16 computed in float32, rounded per node), and the quantized
nodes ExecuTorch's quantizers emit with XNNPACK's integer arithmetic (static
qint8/quint8 convert, convolutions, fully connected, add, multiply, clamp,
max and global average pooling, data movement; dynamic qdint8 activations
with qcint8, qcint4 or blockwise qbint4 weights). Anything else is refused
at init with an UnsupportedOperatorError naming the node kind and datatype.

    backend.py      the Backend (init, execute) and its default registration
    compile.py      the graph as a list of closures, checked at init
    fuse.py         clamps folded into their producers, as XNNPACK does
    shapecheck.py   shape inference and checks, on meta tensors
    run.py          execute: binding arguments, running, writing outputs
    constants.py    datatypes, and weights resolved to tensors once
    context.py      what a node builder sees: its values, checked
    elementwise.py, linear.py, pooling.py, shapes.py, attention.py, convert.py
                    the float node kinds, by family
    quant.py, qlinear.py, qother.py
                    quantized values, Convert, and the quantized node kinds

Importing the package registers the backend in the default registry (unless
a backend is already registered under its id): the loader imports it.
"""

from __future__ import annotations

from exirc.runtime.delegates.registry import BACKENDS
from exirc.runtime.delegates.xnnpack.backend import BACKEND_ID, XnnpackBackend, register

register(BACKENDS)

__all__ = ["BACKEND_ID", "XnnpackBackend", "register"]
