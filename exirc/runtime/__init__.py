"""The reference interpreter: load and run .pte programs.

    from exirc.runtime import load
    program = load("model.pte")                 # mapped, checked, kernels resolved
    outputs = program.run("forward", [x])       # tensors, numpy arrays or scalars

Users add kernels and backends with `register_kernel` and `register_backend`.
Importing this package is cheap; torch loads with the first name used from it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exirc.runtime.core.inputs import InputSpec
    from exirc.runtime.core.loader import LoadedProgram, load
    from exirc.runtime.core.method import Method
    from exirc.runtime.core.profile import Profile
    from exirc.runtime.delegates.registry import register_backend
    from exirc.runtime.kernels.registry import register_kernel

__all__ = ["InputSpec", "LoadedProgram", "Method", "Profile", "load", "register_backend",
           "register_kernel"]

_HOMES = {
    "load": "core.loader", "LoadedProgram": "core.loader", "Method": "core.method",
    "InputSpec": "core.inputs", "register_kernel": "kernels.registry",
    "register_backend": "delegates.registry", "Profile": "core.profile",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `exirc.serialize.npy` (numpy only) does not pull in torch.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'exirc.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"exirc.runtime.{home}"), name)
