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
    from exirc.runtime.delegates import register_backend
    from exirc.runtime.inputs import InputSpec
    from exirc.runtime.kernels import register_kernel
    from exirc.runtime.loader import LoadedProgram, load
    from exirc.runtime.method import Method
    from exirc.runtime.profile import Profile

__all__ = ["InputSpec", "LoadedProgram", "Method", "Profile", "load", "register_backend",
           "register_kernel"]

_HOMES = {
    "load": "loader", "LoadedProgram": "loader", "Method": "method", "InputSpec": "inputs",
    "register_kernel": "kernels", "register_backend": "delegates", "Profile": "profile",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `exirc.serialize.npy` (numpy only) does not pull in torch.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'exirc.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"exirc.runtime.{home}"), name)
