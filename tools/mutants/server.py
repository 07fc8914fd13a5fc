"""The fork server every mutant's process is forked from, started warm.

It imports torch, the runtime and what they import lazily (`warm`) before
its first fork, and never runs a kernel: forking a process whose OpenMP pool
has started can deadlock the child. One server serves a whole process (a
campaign, a test session) until `stop`.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import tempfile
import types
from collections.abc import Iterator, Sequence
from typing import Any

from tools.mutants import warm
from tools.mutants.child import ready


def context(warm_modules: Sequence[str] = ()) -> Any:
    """The forkserver context, its server started (once a process), told to
    import `warm.py` and `warm_modules`."""
    global _started
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["tools.mutants.warm"])
    if _started:
        return forkserver
    listing = None
    if warm_modules:
        # The server reads the list while it starts, after this returns: the
        # file goes when this process exits.
        handle, listing = tempfile.mkstemp(prefix="mutants-warm-", suffix=".txt")
        with os.fdopen(handle, "w") as file:
            file.write("\n".join(warm_modules))
        atexit.register(os.unlink, listing)
        os.environ[warm.WARM_LIST_ENV] = listing  # the server inherits it when it starts
    try:
        # A first process waits for the server to finish importing, so no
        # mutant's wall-clock cap runs while the server is still starting.
        first = forkserver.Process(target=ready, daemon=True)
        start(first)
    finally:
        if listing is not None:
            del os.environ[warm.WARM_LIST_ENV]
    first.join(_SERVER_START_SECONDS)
    _started = True
    return forkserver


def stop() -> None:
    """Stop the fork server (it holds torch and the runtime in memory), so a
    test session does not keep it after the suite; the next run starts one."""
    global _started
    running = getattr(multiprocessing.forkserver, "_forkserver", None)
    halt = getattr(running, "_stop", None)  # private, so looked up with care
    if callable(halt):
        halt()
        _started = False


_started = False  # the server imports what it is told once, when it starts
_SERVER_START_SECONDS = 300.0


def start(process: Any) -> None:
    """`process.start()`, without the child re-running our `__main__` first."""
    with _no_main_module():
        process.start()


@contextlib.contextmanager
def _no_main_module() -> Iterator[None]:
    """Start a process without it re-running our `__main__` first.

    multiprocessing re-executes the parent's main module in every child, so
    a child can unpickle functions defined there; ours live in
    `tools.mutants.child`. Re-running the main module (pytest, the campaign)
    costs each mutant ~0.1 s, so a stub stands in for it while starting."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real
