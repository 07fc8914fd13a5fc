"""The built-in targets: what `--target` accepts, and what each one's runtime runs.

A target is one file here, `<target>.yaml`: its default pass pipeline and the
kernel sets its runtime has (`kernels:`). A kernel set is a list beside it,
`<set>_kernels.txt` (one operator a line, named as a program's operator table
names it: `namespace::name.overload`, or `namespace::name` for a default
overload; `tools/gen_kernel_list.py` writes `portable_kernels.txt` from
ExecuTorch's portable runtime), or `backend_ops`, the kernels of exirc's own
backend ops, which the compiler knows (`exirc.plan.kernels`).

Adding a target is adding a YAML file: every list of targets (the CLI's
choices, the tests that run each target against eager PyTorch) reads them.
This package is data: it imports nothing of exirc's but its errors.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from exirc.errors import UsageError

DEFAULT_TARGET = "portable"
BACKEND_OPS = "backend_ops"  # the kernel set of exirc's backend ops


def builtin_targets() -> tuple[str, ...]:
    """Every target `--target` accepts, sorted."""
    return tuple(sorted(entry.name.removesuffix(".yaml")
                        for entry in resources.files(__name__).iterdir()
                        if entry.name.endswith(".yaml")))


def pipeline_text(target: str) -> str:
    """The YAML text of `target`'s default pipeline; UsageError for an unknown target."""
    if target not in builtin_targets():
        raise UsageError(f"unknown target {target!r}",
                         hint=f"targets: {', '.join(builtin_targets())}")
    return resources.files(__name__).joinpath(f"{target}.yaml").read_text()


@functools.cache
def kernel_sets(target: str) -> tuple[str, ...]:
    """The kernel sets `target`'s runtime has, as its YAML file names them."""
    data: Any = yaml.safe_load(pipeline_text(target))
    return tuple(data.get("kernels") or ())


@functools.cache
def kernel_list(kernel_set: str) -> frozenset[str]:
    """The operators of the kernel list `<kernel_set>_kernels.txt`."""
    text = resources.files(__name__).joinpath(f"{kernel_set}_kernels.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.strip())
