"""One walk over torch's CompositeImplicitAutograd registrations per change.

To learn which ops of each op namespace are CompositeImplicitAutograd (CIA)
ops, torch 2.13's `ExportedProgram.run_decompositions` first walks every CIA
registration in the process (`torch._export.utils._materialize_cpp_cia_ops`:
about 840 of them, a `getattr` each, so that `torch.ops` holds them all). The
walk does not depend on the namespace, yet it runs once per namespace: about
30 walks per question with torch's own namespaces, 40 once ExecuTorch and
torchao are loaded, and a decomposition asks at least twice. Measured: a fifth
of a small model's compile (0.05 of 0.25 s), 8% of a transformer's.

`cia_walks_on_change()` makes the walk run again only when the registrations
differ from the ones it walked last. That is equivalent: a walk over the
registrations the last walk saw finds only the attributes that walk made. It
lasts for the decompositions inside it, where no op is registered or destroyed
(and a registration that does happen changes the list, so it is walked), then
puts torch's function back. Nested and concurrent uses share one walker.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from types import ModuleType

import torch

_CIA_KEY = "CompositeImplicitAutograd"
_WALK = "_materialize_cpp_cia_ops"  # torch._export.utils' walk
_lock = threading.Lock()
_depth = 0
_torch_walk: Callable[[], None] | None = None


@contextlib.contextmanager
def cia_walks_on_change() -> Iterator[None]:
    """Within: torch walks the CIA registrations only when they changed."""
    utils = _export_utils()
    if utils is None:  # another torch: its own walk, unchanged
        yield
        return
    _enter(utils)
    try:
        yield
    finally:
        _leave(utils)


def _export_utils() -> ModuleType | None:
    """torch._export.utils, when it has the walk and torch can list registrations."""
    try:
        utils = importlib.import_module("torch._export.utils")
    except ImportError:
        return None
    listable = hasattr(torch._C, "_dispatch_get_registrations_for_dispatch_key")
    return utils if listable and callable(getattr(utils, _WALK, None)) else None


def _enter(utils: ModuleType) -> None:
    global _depth, _torch_walk
    with _lock:
        if _depth == 0:
            _torch_walk = getattr(utils, _WALK)
            setattr(utils, _WALK, _walk_on_change(_torch_walk))
        _depth += 1


def _leave(utils: ModuleType) -> None:
    global _depth, _torch_walk
    with _lock:
        _depth -= 1
        if _depth == 0:
            setattr(utils, _WALK, _torch_walk)
            _torch_walk = None


def _walk_on_change(walk: Callable[[], None]) -> Callable[[], None]:
    walked: list[str] | None = None
    walk_lock = threading.Lock()

    def walk_if_registrations_changed() -> None:
        nonlocal walked
        registrations = torch._C._dispatch_get_registrations_for_dispatch_key(_CIA_KEY)
        with walk_lock:
            if registrations != walked:
                walk()
                walked = registrations

    return walk_if_registrations_changed
