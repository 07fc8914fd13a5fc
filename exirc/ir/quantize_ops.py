"""Making sure torch knows the Q/DQ ops before a graph that calls them is read.

`torch.ops.quantized_decomposed` is filled in by imports: torch defines the
per-tensor ops, torchao (pt2e) the per-channel and per-token ones. A `.pt2`
archive of a quantized model can only be loaded, and a quantized graph only be
rewritten, after both ran.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any


@functools.cache
def define_quantize_ops() -> Any:
    """torch.ops.quantized_decomposed, with every op torch and torchao define."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the ops)

    with contextlib.suppress(ImportError):
        import torchao.quantization.pt2e  # noqa: F401  (defines the rest)
    return torch.ops.quantized_decomposed
