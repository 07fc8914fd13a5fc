"""Warming the fork server: import, before forking, what mutants import lazily.

The runtime imports much on first use (torch's meta kernels for the
load-time shape checks pull in sympy; the inspector its views). Imported
after the fork, that costs each mutant a second. So the runner first runs
a few bases through every stage in a throwaway process, lists the modules
that imported (`discover`), and the fork server imports them all at start
(this module, preloaded, reads the list from `WARM_LIST_ENV`). The server
itself still never runs a kernel.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

WARM_LIST_ENV = "EXIRC_MUTANTS_WARM_LIST"
_MARKER = "--- modules imported ---"


def discover(bases: Sequence[bytes], timeout: float = 600.0) -> list[str]:
    """The modules a process imports driving `bases` through every stage.
    `timeout` is a cap for a process that never ends: an honest one takes
    seconds, however busy the machine."""
    with tempfile.TemporaryDirectory(prefix="mutants-warm-") as folder:
        paths = []
        for i, data in enumerate(bases):
            path = os.path.join(folder, f"{i}.pte")
            with open(path, "wb") as file:
                file.write(data)
            paths.append(path)
        done = subprocess.run([sys.executable, "-m", "tools.mutants.warm", *paths],
                              capture_output=True, text=True, timeout=timeout,
                              cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": _path()})
    listed = done.stdout.split(_MARKER, 1)[-1] if _MARKER in done.stdout else ""
    return [line for line in listed.split() if not line.startswith("__")]


def _path() -> str:
    """sys.path as PYTHONPATH, so the subprocess finds `tools` as this process does."""
    return os.pathsep.join(p for p in sys.path if p)


def _import_listed() -> None:
    listing = os.environ.get(WARM_LIST_ENV)
    if not listing or not os.path.exists(listing):
        return
    with open(listing) as names:
        for name in names.read().split():
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 (a module that only imports in context)
                continue
    _read_kernel_lists()


def _read_kernel_lists() -> None:
    """Parse the targets' kernel lists (YAML and text, cached): data, not kernels."""
    from exirc import targets

    for target in targets.builtin_targets():
        for kernel_set in targets.kernel_sets(target):
            if kernel_set != targets.BACKEND_OPS:
                targets.kernel_list(kernel_set)
    allowlist = sys.modules.get("exirc.runtime.kernels.allowlist")
    operators = getattr(allowlist, "allowlisted_operators", None)
    if callable(operators):
        operators()


def _drive(paths: Sequence[str]) -> None:
    """Every stage a mutant's process runs, on each file (in this throwaway process)."""
    import numpy

    from exirc.runtime import load
    from tools.mutants import child

    views = [arg for view in child.INSPECT_VIEWS for arg in ("--show", view)]
    for path in paths:
        with open(path, "rb") as file:
            data = file.read()
        # What fails here has imported what it needed all the same.
        with contextlib.suppress(Exception):
            for method in load(data).methods.values():
                method.run(child.random_inputs(method.inputs, numpy.random.default_rng(0),
                                               1 << 20))
        for args in (["run", path, "--random"], ["inspect", path, "--json", *views]):
            with contextlib.suppress(Exception):
                child._cli(args)
    _run_a_python_meta_kernel()


def _run_a_python_meta_kernel() -> None:
    """What torch's Python meta kernels import on first use (torch._dynamo,
    sympy: over a second). The warm base's load-time checks no longer run one
    (`exirc.runtime.kernels.meta_rules` answers its ops), but most mutants' do: an
    integer add is one the rules leave to torch."""
    import torch

    small = torch.empty(2, dtype=torch.int64, device="meta")
    torch.ops.aten.add.out(small, small, out=torch.empty_like(small))


if __name__ == "__main__":
    before = set(sys.modules)
    import tools.mutants.child  # noqa: F401 (what the server imports anyway)

    _drive(sys.argv[1:])
    sys.stdout = sys.__stdout__
    print(_MARKER)
    print("\n".join(sorted(set(sys.modules) - before)))
else:
    import tools.mutants.child  # noqa: F401 (the mutant's code, preloaded)

    _import_listed()
    # Frozen before the server's first fork: a mutant's garbage collections skip the
    # million objects it inherited, instead of walking them (and copying every page
    # they sit on, as the collector writes to each object's header).
    gc.freeze()
