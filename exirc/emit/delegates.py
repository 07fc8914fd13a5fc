"""Delegate calls -> `DelegateCall` instructions, payloads and named data.

A method lists its delegates (`ExecutionPlan.delegates`); each payload is a
data segment of the program, as ExecuTorch's runtime expects, and the
weights backends keep by key are named data, stored once however many
delegates (or methods) share them.
"""

from __future__ import annotations

from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.errors import InternalError
from exirc.serialize import program as P


def backend_delegate(lowered: LoweredDelegate) -> P.BackendDelegate:
    """The method's entry for `lowered`; its payload's segment is set by `attach`."""
    return P.BackendDelegate(
        id=lowered.backend_id,
        processed=P.BackendDelegateDataReference(P.DataLocation.SEGMENT, -1),
        compile_specs=[P.CompileSpec(k, bytes(v)) for k, v in lowered.result.compile_specs])


def attach(program: P.Program, plan: P.ExecutionPlan, lowered: list[LoweredDelegate]) -> None:
    """Store the payloads and named data of `plan`'s delegates in `program`."""
    stored = {named.key: program.segments[named.segment_index].data
              for named in program.named_data}
    for entry, delegate in zip(plan.delegates, lowered, strict=True):
        program.segments.append(P.DataSegment(delegate.result.processed))
        entry.processed = P.BackendDelegateDataReference(P.DataLocation.SEGMENT,
                                                         len(program.segments) - 1)
        for key, data in delegate.result.named_data.items():
            if key in stored:
                if bytes(stored[key]) != bytes(data):
                    raise InternalError(f"two delegates store different data under the "
                                        f"named-data key {key!r}")
                continue
            program.add_named_segment(key, bytes(data))
            stored[key] = data
