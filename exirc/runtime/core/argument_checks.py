"""Load-time checks of every KernelCall's arguments against the memory plan.

Called once per method, after its value table is built and before any
instruction is prepared, so a program whose arguments a kernel could
mishandle is refused with a `FormatError` before it runs. For each KernelCall:

  * no tensor it writes shares memory with another it names (`overlap`),
    except the exact aliasing `aliasing` allows;
  * its outs and results have the sizes and dtypes the op makes from its
    arguments, and the op accepts those arguments (`meta_shapes`);
  * the dim-order copies' `dim_order` arguments fit their outs (`dim_order_args`).

Kinds and list lengths are checked before (`argument_kinds`, as soon as the
kernels resolve); a call whose values are not of the kinds its schema takes
is not looked at here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from exirc.runtime.core.aliasing import may_alias
from exirc.runtime.core.dim_order_args import check_dim_order_call
from exirc.runtime.core.kernel_arguments import CallArguments, call_arguments
from exirc.runtime.core.meta_shapes import MetaShapes
from exirc.runtime.core.overlap import Locations, check_call
from exirc.runtime.core.values import Values
from exirc.runtime.kernels.registry import Kernel, operator_key
from exirc.serialize import program as P

# Distinct calls whose passing is remembered (`check_method`).
_PASSED_KEPT = 4096


def check_method(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel], values: Values,
                 where: str) -> None:
    """Refuse `plan` if any KernelCall's arguments are unsafe for its kernel.

    The calls are described twice, one at a time (for where views lead, then
    for the checks), rather than kept: a description per call, kept, would
    cost many times what the file spends on the call."""
    locations = Locations(plan, _kernel_calls(plan, kernels))
    shapes = MetaShapes(values)
    # The checks read only a call's operator and arguments and the method's
    # fixed tables: a call equal to one checked already passes as it did (a
    # file can repeat one call a hundred thousand times).
    passed: set[tuple[int, ...]] = set()
    for (c, i), call in _kernel_calls(plan, kernels):
        instr = plan.chains[c].instructions[i]
        assert isinstance(instr, P.KernelCall)
        key = (instr.op_index, *instr.args)
        if key in passed:
            continue
        op = plan.operators[instr.op_index]
        at = f"{where}.chains[{c}].instructions[{i}] ({operator_key(op.name, op.overload)})"
        check_call(call, locations, plan.values, may_alias, at)
        check_dim_order_call(call, values, at)
        shapes.check(call, at)
        if len(passed) < _PASSED_KEPT:
            passed.add(key)


def _kernel_calls(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel]
                  ) -> Iterator[tuple[tuple[int, int], CallArguments]]:
    """((chain, instruction), the call's arguments), in instruction order, for
    each KernelCall whose values have the kinds its schema takes."""
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            if isinstance(instr, P.KernelCall) and instr.op_index in kernels:
                described = call_arguments(kernels[instr.op_index], instr.args, plan.values)
                if described is not None:
                    yield (c, i), described
