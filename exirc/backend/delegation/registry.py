"""Delegation backends and partitioners by name.

`xnnpack` is built in. A pipeline names a partitioner by its built-in name or
as `module:attr` (a class, instantiated with no arguments, or an instance);
a partition is preprocessed by the backend registered under its backend id,
or by the partitioner's own `backends` mapping when it brings one.
"""

from __future__ import annotations

from typing import Any

from exirc.backend.delegation.interface import DelegationBackend, Partitioner
from exirc.errors import UsageError
from exirc.passes.pipeline import import_reference

_BACKENDS: dict[str, DelegationBackend] = {}


def register_delegation_backend(backend: DelegationBackend) -> DelegationBackend:
    """Make `backend` preprocess the partitions that name its `backend_id`."""
    _BACKENDS[backend.backend_id] = backend
    return backend


def _builtin_partitioners() -> dict[str, Any]:
    # Imported when first asked for: the backends' op tables are big.
    from exirc.backend.delegation.capability import CapabilityPartitioner
    from exirc.backend.xnnpack.serializer import XnnpackBackend
    from exirc.backend.xnnpack.support import XnnpackSupport

    register_delegation_backend(XnnpackBackend())
    return {"xnnpack": lambda: CapabilityPartitioner(XnnpackSupport())}


BUILTIN_PARTITIONER_NAMES = ("xnnpack",)


def resolve_partitioner(name: str) -> Partitioner:
    """The partitioner a pipeline names."""
    if name in BUILTIN_PARTITIONER_NAMES:
        made: Partitioner = _builtin_partitioners()[name]()
        return made
    if ":" not in name:
        raise UsageError(f"unknown partitioner {name!r}",
                         hint=f"built-in: {', '.join(BUILTIN_PARTITIONER_NAMES)}; "
                              "or name your own as module:attr")
    found = import_reference(name, f"partitioner {name}")
    partitioner = found() if isinstance(found, type) else found
    if not callable(getattr(partitioner, "partition", None)):
        raise UsageError(f"{name} is not a partitioner: it has no partition(program) method")
    for backend in dict(getattr(partitioner, "backends", {}) or {}).values():
        register_delegation_backend(backend)
    return partitioner


def delegation_backend(backend_id: str) -> DelegationBackend:
    backend = _BACKENDS.get(backend_id)
    if backend is None:
        raise UsageError(f"a partition names backend {backend_id!r}, but no delegation "
                         "backend is registered under that id",
                         hint="register it with exirc.backend.delegation.registry."
                              "register_delegation_backend, or give the partitioner a "
                              "`backends` mapping")
    return backend
