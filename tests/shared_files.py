"""What several test modules make alike, made once per test run.

`make test` gives each test module to one of two workers (pytest-xdist,
`--dist loadfile`), so a session fixture or a `functools.cache` is made once
per worker that needs it, not once per run: ExecuTorch's lowering of the same
zoo model, read by four modules, was made on both workers. `shared(key, make)`
keeps what `make()` returns in a folder every worker of the run sees (the
run's own temporary root, which pytest deletes with its old runs), made by
whichever worker asks first while the other waits on a file lock.

Only deterministic things belong here: `make` must return the same value
whichever worker calls it (seed what it draws), so that sharing changes no
test's inputs.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock

T = TypeVar("T")

_root: Path | None = None


def set_root(folder: Path | None) -> None:
    """Where this run's shared things go (tests/conftest.py sets it per worker,
    to the same folder for all workers of one run)."""
    global _root
    _root = folder


def _folder() -> Path:
    if _root is None:  # outside pytest (a script importing a test helper)
        return Path(tempfile.mkdtemp(prefix="exirc-shared-"))
    _root.mkdir(parents=True, exist_ok=True)
    return _root


def shared_folder(name: str) -> Path:
    """A folder of this run's shared things, for a `make` that writes files (and
    returns their paths)."""
    folder = _folder() / name
    folder.mkdir(exist_ok=True)
    return folder


def shared(key: str, make: Callable[[], T]) -> T:
    """`make()`, or what an earlier call with `key` made in this test run
    (pickled; any worker's). Outside pytest there is no run to share with."""
    if _root is None:
        return make()
    name = hashlib.sha256(key.encode()).hexdigest()[:24]
    folder = _folder()
    path = folder / f"{name}.pickle"
    with FileLock(str(folder / f"{name}.lock")):
        if path.exists():
            with path.open("rb") as file:
                value: T = pickle.load(file)  # noqa: S301 - written by this run
            return value
        value = make()
        scratch = path.with_suffix(f".{os.getpid()}.part")
        with scratch.open("wb") as file:
            pickle.dump(value, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(scratch, path)
        return value


def module_digest(module: Any) -> str:
    """A digest of a torch module's structure and state: part of a key, so that two
    models a key's other parts cannot tell apart are not taken for one."""
    import torch

    digest = hashlib.sha256(repr(module).encode())
    for name, tensor in module.state_dict().items():
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name} {data.dtype} {tuple(tensor.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


def origin(function: Any) -> str:
    """A name for a model builder that tells two zoos' builders of one name apart."""
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"
