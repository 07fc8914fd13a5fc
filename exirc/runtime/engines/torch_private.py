"""The one place the engines use a private torch API: a storage's use count.

A fused chain hands its outputs out without copying them and must know, before
the next run, whether the caller still holds one (`OutputMemory.held_elsewhere`).
torch counts a storage's users in C++ (`torch._C._storage_Use_Count`); no public
API says it. Where this torch lacks it, `FREE_COUNTS` is None and every output
gets fresh memory each run (a copy per run: slower, never wrong).
`tests/runtime/engines/test_private_apis.py` fails loudly when a torch release
changes what this relies on.
"""

from __future__ import annotations

import sys

import torch


def storage_uses(storage: torch.UntypedStorage) -> int:
    """The tensors and storage handles sharing `storage` (torch's own count: a
    numpy array or DLPack capsule counts through the tensor it keeps). The
    Python storage object is not among them: torch keeps one per storage, whose
    holders only its Python reference count shows."""
    return int(torch._C._storage_Use_Count(storage._cdata))


def _free_counts() -> tuple[int, int] | None:
    """`storage_uses` and the storage's reference count for a tensor nothing else
    references, as this torch reports them; None if torch cannot say."""
    tensor = torch.empty(1)
    storage = tensor.untyped_storage()
    try:
        return storage_uses(storage), sys.getrefcount(storage)
    except (AttributeError, RuntimeError):
        return None


FREE_COUNTS = _free_counts()
