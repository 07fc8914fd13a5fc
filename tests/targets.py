"""The built-in targets, one per pipeline file exirc ships (`exirc/pipelines/*.yaml`).

Not a test module: tests that compare compiled programs with eager PyTorch
parametrize over these, so a new target is tested the day its YAML lands.
"""

from __future__ import annotations

from importlib import resources


def builtin_targets() -> list[str]:
    """Every target `--target` accepts, sorted: the default pipelines' names."""
    return sorted(entry.name.removesuffix(".yaml")
                  for entry in resources.files("exirc.pipelines").iterdir()
                  if entry.name.endswith(".yaml"))


TARGETS: list[str] = builtin_targets()

# The target whose programs use only kernels ExecuTorch's portable runtime has.
PORTABLE = "portable"
