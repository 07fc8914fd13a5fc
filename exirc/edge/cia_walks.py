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

Listing the registrations to compare them costs a quarter of a walk, so within
one collection over all namespaces (`_collect_all_valid_cia_ops`) they are
listed once, at its first namespace: that loop only reads `torch.ops` and op
schemas, and registers nothing, so a later listing in it would find the same.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

_CIA_KEY = "CompositeImplicitAutograd"
_WALK = "_materialize_cpp_cia_ops"  # torch._export.utils' walk
# torch._export.utils' collection over every namespace, and the modules that call it
# by a name of their own.
_COLLECT = "_collect_all_valid_cia_ops"
_COLLECTORS = ("torch._export.utils", "torch.export.exported_program",
               "torch.export.decomp_utils")
_lock = threading.Lock()
_depth = 0
_torch_walk: Callable[[], None] | None = None
_torch_collect: Callable[[], Any] | None = None
_collectors: list[ModuleType] = []  # the modules whose collection is ours meanwhile
_collecting = threading.local()  # .listed: None outside a collection, else whether listed


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
    global _depth, _torch_walk, _torch_collect
    with _lock:
        if _depth == 0:
            _torch_walk = getattr(utils, _WALK)
            setattr(utils, _WALK, _walk_on_change(_torch_walk))
            _torch_collect = getattr(utils, _COLLECT, None)
            if callable(_torch_collect):
                listing_once = _listing_once(_torch_collect)
                loaded = [sys.modules[name] for name in _COLLECTORS if name in sys.modules]
                _collectors[:] = [module for module in loaded
                                  if getattr(module, _COLLECT, None) is _torch_collect]
                for module in _collectors:
                    setattr(module, _COLLECT, listing_once)
        _depth += 1


def _leave(utils: ModuleType) -> None:
    global _depth, _torch_walk, _torch_collect
    with _lock:
        _depth -= 1
        if _depth == 0:
            setattr(utils, _WALK, _torch_walk)
            for module in _collectors:
                setattr(module, _COLLECT, _torch_collect)
            _collectors.clear()
            _torch_walk = _torch_collect = None


def _listing_once(collect: Callable[[], Any]) -> Callable[[], Any]:
    @functools.wraps(collect)
    def collect_listing_once() -> Any:
        if getattr(_collecting, "listed", None) is not None:  # nested: the outer one lists
            return collect()
        _collecting.listed = False
        try:
            return collect()
        finally:
            _collecting.listed = None

    return collect_listing_once


def _walk_on_change(walk: Callable[[], None]) -> Callable[[], None]:
    walked: list[str] | None = None
    walk_lock = threading.Lock()

    def walk_if_registrations_changed() -> None:
        nonlocal walked
        listed = getattr(_collecting, "listed", None)
        if listed:  # checked at this collection's first namespace
            return
        registrations = torch._C._dispatch_get_registrations_for_dispatch_key(_CIA_KEY)
        with walk_lock:
            if registrations != walked:
                walk()
                walked = registrations
        if listed is not None:
            _collecting.listed = True

    return walk_if_registrations_changed
