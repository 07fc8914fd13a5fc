"""The compiler side of the XNNPACK delegate (ExecuTorch 1.5.1's XnnpackBackend).

`XnnpackSupport` (support.py) says which Backend-dialect nodes XNNPACK can
run and why it cannot run the others; `XnnpackBackend` (serializer.py)
turns a partition of such nodes into the payload ExecuTorch's runtime
loads: an XNNPACK graph (`exirc.serialize.xnnpack.graph`) whose weights go
to the program's named data. Tensors inside a payload are kept in the
layouts XNNPACK's operators read (NHWC for convolution and pooling) and
converted only where an operator or an output needs another order.
"""

from exirc.backend.xnnpack.serializer import XnnpackBackend
from exirc.backend.xnnpack.support import XnnpackSupport

__all__ = ["XnnpackBackend", "XnnpackSupport"]
