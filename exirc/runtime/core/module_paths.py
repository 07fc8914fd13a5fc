"""The submodule each instruction came from, given to loaded methods' sites,
so run-time errors and profiles name it (`[module encoder.layers.1.linear]`).

The paths come from the `exirc.module_paths` segment
(`exirc.serialize.module_paths`); files without it (ExecuTorch's) have none,
and a method whose chains the stored paths do not fit keeps none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from exirc.serialize.module_paths import ModulePaths

if TYPE_CHECKING:
    from exirc.runtime.core.method import Method
    from exirc.serialize import program as P


def name_modules(methods: Mapping[str, Method], plans: Sequence[P.ExecutionPlan],
                 stored: ModulePaths) -> None:
    """Give each method's instruction sites their stored module paths."""
    for plan in plans:
        paths = stored.of_plan(plan)
        method = methods.get(plan.name)
        if paths is not None and method is not None:
            method.name_modules(paths)
