"""The built-in targets, one per file exirc ships (`exirc/targets/*.yaml`).

Not a test module: tests that compare compiled programs with eager PyTorch
parametrize over these, so a new target is tested the day its YAML lands.
"""

from __future__ import annotations

from exirc.targets import builtin_targets

TARGETS: list[str] = list(builtin_targets())

# The target whose programs use only kernels ExecuTorch's portable runtime has.
PORTABLE = "portable"
