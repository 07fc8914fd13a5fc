"""What every stage needs of torchao's pt2e flow to read a quantized graph.

`torch.ops.quantized_decomposed` is filled in by imports: torch defines the
per-tensor ops, torchao (pt2e) the per-channel and per-token ones. A `.pt2`
archive of a quantized model can only be loaded, and a quantized graph only be
rewritten, after both ran. torchao is an optional extra (`exirc[quantize]`):
this module and `exirc.quantize` are the only ones that import it, and each
use here works without it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@functools.cache
def define_quantize_ops() -> Any:
    """torch.ops.quantized_decomposed, with every op torch and torchao define."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the ops)

    with contextlib.suppress(ImportError):
        import torchao.quantization.pt2e  # noqa: F401  (defines the rest)
    return torch.ops.quantized_decomposed


def exported_graph_to_eval(module: torch.fx.GraphModule) -> None:
    """Switch an exported graph to eval mode as torchao's pt2e flow does, or,
    without torchao, flip the flags (nothing patched .eval() then, and an
    exported graph's ops do not read them)."""
    import torch

    try:
        from torchao.quantization.pt2e import move_exported_model_to_eval as switch
    except ImportError:
        torch.nn.Module.train(module, False)
        return
    switch(module)
    torch.nn.Module.train(module, False)
