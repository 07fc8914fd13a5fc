"""Tensors by content: one weight is one weight, however many methods read it.

The emitter stores each distinct constant once (`exirc.emit.constants`), so a
model's prefill and decode methods share their weights in the file. Reports
that add up weights over methods (quantization, delegation) key them by this
digest to count each once, as the file stores them.
"""

from __future__ import annotations

import hashlib

import torch


def content_digest(*tensors: torch.Tensor) -> str:
    """The tensors' dtypes, shapes and bytes, hashed: equal content, equal digest."""
    hashed = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().contiguous().reshape(-1)
        hashed.update(f"{tensor.dtype}{list(tensor.shape)};".encode())
        hashed.update(flat.view(torch.uint8).numpy().tobytes())
    return hashed.hexdigest()
