"""Load-time checks of every KernelCall's arguments against the memory plan.

Called once per method, after its value table is built and before any
instruction is prepared, so a program whose arguments a kernel could
mishandle is refused with a `FormatError` before it runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from exirc.runtime.kernels import Kernel
from exirc.runtime.values import Values
from exirc.serialize import program as P


def check_method(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel], values: Values,
                 where: str) -> None:
    """Refuse `plan` if any KernelCall's arguments are unsafe for its kernel."""
