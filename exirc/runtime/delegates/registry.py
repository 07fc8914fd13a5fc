"""Backends: what runs a DelegateCall, found by the delegate's backend id.

A program hands part of a graph to a backend as an opaque payload
(`BackendDelegate.processed`) plus compile specs. At load, each delegate is
initialised once by the backend registered under its id; at run time, a
DelegateCall gives the backend its handle and the call's arguments (inputs
then outputs, as value-table entries), and the backend writes the output
tensors in place. A delegate whose backend is not registered is an error at
load, with every other missing piece of the program.
"""

from __future__ import annotations

import inspect
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from exirc.errors import ExircError, FormatError
from exirc.serialize import program as P


@dataclass(frozen=True)
class BackendInitContext:
    """What a backend may look up while initialising a payload
    (ExecuTorch's BackendInitContext): the program's named data, where
    delegates keep weights so that they are stored once."""

    program: P.Program
    where: str
    # key -> segment data, built once per load: a payload may read hundreds
    # of weights, and a scan of named_data per weight is quadratic.
    index: Mapping[str, bytes | memoryview] | None = None

    def __post_init__(self) -> None:
        if self.index is None:
            object.__setattr__(self, "index", named_data_index(self.program))

    def named_data(self, key: str) -> bytes | memoryview | None:
        """The bytes the program stores under `key`, or None."""
        assert self.index is not None  # set by __post_init__
        return self.index.get(key)


def named_data_index(program: P.Program) -> dict[str, bytes | memoryview]:
    """Named data by key (the first entry of a key wins, as a lookup finds it)."""
    index: dict[str, bytes | memoryview] = {}
    for named in program.named_data:
        if named.key not in index and 0 <= named.segment_index < len(program.segments):
            index[named.key] = program.segments[named.segment_index].data
    return index


class Backend(Protocol):
    """What a backend implements (ExecuTorch's BackendInterface, in Python).

    `init` may take a third argument, a `BackendInitContext`; backends that
    keep weights in the program's named data need it.
    """

    def init(self, processed: bytes | memoryview, compile_specs: Sequence[P.CompileSpec]) -> Any:
        """Prepare a payload once, at load; the result is passed to every `execute`."""

    def execute(self, handle: Any, args: list[Any]) -> None:
        """Run on `args` (tensors and scalars), writing the output tensors in place."""


B = TypeVar("B")


class BackendRegistry:
    """Backends by id. Lookups fall back to the parent registry."""

    def __init__(self, parent: BackendRegistry | None = None) -> None:
        # Lookups fall through to the parent's entries, never writes.
        self._backends: ChainMap[str, Backend] = (
            ChainMap({}) if parent is None else parent._backends.new_child())

    def register(self, backend_id: str, backend: Any = None) -> Any:
        """Register `backend` (an instance, or a class to instantiate) under `backend_id`.

        Usable as a class decorator: `@register_backend("MyBackend")`.
        """
        if backend is None:
            def decorate(cls: B) -> B:
                self.register(backend_id, cls)
                return cls
            return decorate
        self._backends[backend_id] = backend() if isinstance(backend, type) else backend
        return backend

    def find(self, backend_id: str) -> Backend | None:
        return self._backends.get(backend_id)


BACKENDS = BackendRegistry()
"""The default registry of backends."""


def register_backend(backend_id: str, backend: Any = None) -> Any:
    """Register a backend in the default registry (see `BackendRegistry.register`)."""
    return BACKENDS.register(backend_id, backend)


def payload(program: P.Program, delegate: P.BackendDelegate) -> bytes | memoryview:
    ref = delegate.processed
    if ref.location == P.DataLocation.INLINE:
        return program.backend_delegate_data[ref.index].data
    return program.segments[ref.index].data


def initialise(backend: Backend, program: P.Program, delegate: P.BackendDelegate,
               where: str, named_data: Mapping[str, bytes | memoryview] | None = None) -> Any:
    """The backend's handle for one delegate; a backend refusing its payload is a
    program error, reported as such. A typed exirc error (an unsupported node
    kind, say) keeps its type and exit code."""
    args: list[Any] = [payload(program, delegate), delegate.compile_specs]
    if _takes_context(backend):
        args.append(BackendInitContext(program, where, named_data))
    try:
        return backend.init(*args)
    except ExircError:
        raise
    except Exception as error:  # noqa: BLE001 (any failure of foreign code)
        raise FormatError(f"backend {delegate.id!r} could not initialise its payload: "
                          f"{type(error).__name__}: {error}", field=where) from error


def _takes_context(backend: Backend) -> bool:
    try:
        parameters = inspect.signature(backend.init).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in positional)


def bind(backend: Backend, handle: Any, args: Sequence[int], env: list[Any],
         written: frozenset[int]) -> Callable[[], None]:
    """The DelegateCall as a closure; arguments are resolved now unless written at run time."""
    execute = backend.execute
    if not any(index in written for index in args):
        fixed = [env[index] for index in args]

        def call() -> None:
            execute(handle, fixed)
        return call
    indices = list(args)

    def call_reading_values() -> None:
        execute(handle, [env[index] for index in indices])
    return call_reading_values
