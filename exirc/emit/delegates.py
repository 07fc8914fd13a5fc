"""Delegate calls -> `DelegateCall` instructions, payloads and named data.

A method lists its delegates (`ExecutionPlan.delegates`); each payload is a
data segment of the program, as ExecuTorch's runtime expects. The weights
backends keep by key are named data, each distinct content stored once:
however many delegates (or methods) share a key, under another key with the
same bytes (one segment, named twice), and, when a constant buffer of the
program holds the same bytes (an embedding table a kernel reads and an LM
head a delegate reads, tied), inside the constant segment: the named data's
segment points at the buffer's bytes there.
"""

from __future__ import annotations

from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.emit.constants import ConstantTable, content_key
from exirc.errors import InternalError
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile


def backend_delegate(lowered: LoweredDelegate) -> P.BackendDelegate:
    """The method's entry for `lowered`; its payload's segment is set by `attach`."""
    return P.BackendDelegate(
        id=lowered.backend_id,
        processed=P.BackendDelegateDataReference(P.DataLocation.SEGMENT, -1),
        compile_specs=[P.CompileSpec(k, bytes(v)) for k, v in lowered.result.compile_specs])


def attach(program: P.Program, plan: P.ExecutionPlan, lowered: list[LoweredDelegate],
           constants: ConstantTable, data_file: DataFile | None = None) -> None:
    """Store the payloads and named data of `plan`'s delegates in `program`
    (after `constants` are attached, so named data can share their bytes), the
    named data in `data_file` instead when the weights are external."""
    if data_file is not None:
        _attach_external(program, plan, lowered, data_file)
        return
    stored = {named.key: program.segments[named.segment_index].data
              for named in program.named_data}
    by_content = {content_key(bytes(program.segments[named.segment_index].data)):
                  named.segment_index for named in program.named_data}
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
            stored[key] = data
            content = content_key(bytes(data))
            if content in by_content:  # the same bytes under another key: one segment
                program.named_data.append(P.NamedData(key, by_content[content]))
                continue
            program.add_named_segment(key, bytes(data), constants.stored_at(bytes(data)))
            by_content[content] = len(program.segments) - 1


def _attach_external(program: P.Program, plan: P.ExecutionPlan, lowered: list[LoweredDelegate],
                     data_file: DataFile) -> None:
    """Payloads in the program, their weights in the data file (which stores
    equal bytes once, whatever their keys)."""
    for entry, delegate in zip(plan.delegates, lowered, strict=True):
        program.segments.append(P.DataSegment(delegate.result.processed))
        entry.processed = P.BackendDelegateDataReference(P.DataLocation.SEGMENT,
                                                         len(program.segments) - 1)
        for key, data in delegate.result.named_data.items():
            known = data_file.get(key)
            if known is not None and bytes(known.data) != bytes(data):
                raise InternalError(f"two delegates store different data under the "
                                    f"named-data key {key!r}")
            data_file.add(key, bytes(data))
