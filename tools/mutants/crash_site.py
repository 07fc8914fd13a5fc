"""Where a crashed mutant crashed: which instruction, which operator.

A crash leaves only a signal and faulthandler's Python stack, which ends in
the binding's generic call. So the mutant is run once more in a process that
notes each instruction as it completes (`child.locate_crash`); if it crashes
again, the instruction after the last one noted is where.
"""

from __future__ import annotations

import os
from typing import Any

from exirc.errors import ExircError
from exirc.serialize import deserialize
from exirc.serialize import program as P
from tools.mutants import server
from tools.mutants.child import Limits, locate_crash
from tools.mutants.generate import Mutant


def locate(context: Any, mutant: Mutant, limits: Limits, log_path: str, wait: float) -> str:
    """Where a crashed run crashed: the mutant run again in a process that
    notes each instruction as it completes (`child.locate_crash`), given
    `wait` seconds to crash again (a cap: nothing is judged by it)."""
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=locate_crash, daemon=True,
                              args=(mutant.data, mutant.spec.route, mutant.spec.seed, limits,
                                    log_path, send))
    server.start(process)
    send.close()
    process.join(wait)
    if process.is_alive():
        process.kill()
        process.join()
    receive.close()
    try:
        with open(f"{log_path}.steps") as steps:
            last = (steps.read().splitlines() or [""])[-1]
        os.unlink(f"{log_path}.steps")
    except OSError:
        return ""
    if process.exitcode is None or process.exitcode >= 0 or not last:
        return ""  # it did not crash again: nothing to place
    return crash_site(mutant.data, last)


def crash_site(data: bytes, last: str) -> str:
    """`in instruction 4 of chain 0 of forward (aten::foo.out)` from the last
    line `locate_crash` wrote: a run's start, or the instruction it completed
    (the crash was in the one after, unless that one jumped)."""
    method, *where = last.split()
    chain, index = (0, 0) if where == ["start"] else (int(where[0]), int(where[1]) + 1)
    try:
        plan = deserialize(data).method(method)
        instruction = plan.chains[chain].instructions[index]
    except (ExircError, IndexError):
        return f"after instruction {index - 1} of chain {chain} of {method}"
    what = type(instruction).__name__
    if isinstance(instruction, P.KernelCall) and 0 <= instruction.op_index < len(plan.operators):
        what = plan.operators[instruction.op_index].qualified_name
    return f"in instruction {index} of chain {chain} of {method} ({what})"
