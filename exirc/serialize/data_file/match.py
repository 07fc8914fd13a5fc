"""Which tensors a program keeps in a data file, and whether a data file has them.

A tensor whose `extra_tensor_info` says `location EXTERNAL` is found by its
fully qualified name in the data file; the stored entry must have the
tensor's dtype and sizes (ExecuTorch's runtime checks the same), so a data
file of another program, or of an older compile, is refused by name rather
than read as the wrong weights. Both the loader and `exirc inspect --data`
ask here.
"""

from __future__ import annotations

from collections.abc import Mapping

from exirc.errors import ExternalDataError
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile, TensorLayout

Bytes = bytes | memoryview


def external_tensors(program: P.Program) -> dict[str, list[tuple[str, P.Tensor]]]:
    """Name -> (where, tensor) of each tensor the program keeps outside itself."""
    found: dict[str, list[tuple[str, P.Tensor]]] = {}
    for i, plan in enumerate(program.execution_plan):
        for j, value in enumerate(plan.values):
            if isinstance(value, P.Tensor):
                extra = value.extra_tensor_info
                if extra is not None and extra.location == P.TensorDataLocation.EXTERNAL:
                    where = f"execution_plan[{i}].values[{j}]"
                    found.setdefault(extra.fully_qualified_name or "", []).append((where, value))
    return found


def resolve_tensors(program: P.Program, data: DataFile, name: str | None) -> dict[str, Bytes]:
    """Name -> bytes of each external tensor, checked; ExternalDataError naming what is
    missing when `name` is None (no data file given) or the file lacks or mismatches it."""
    wanted = external_tensors(program)
    if not wanted:
        return {}
    if "" in wanted:
        where = wanted[""][0][0]
        raise ExternalDataError(f"{where} keeps its data outside the program but has no name "
                                "to find it by", hint="the program file is malformed; "
                                "re-create it")
    if name is None:
        raise ExternalDataError(f"the program reads {_count(wanted)} from an external data "
                                f"file ({listed(list(wanted))}), and none was given")
    missing = [key for key in wanted if key not in data.entries]
    if missing:
        raise ExternalDataError(
            f"the data file {name} does not have {_count(missing)} the program reads "
            f"({listed(missing)}); it has {len(data.entries)} entries",
            hint="pass the data file this program was compiled with; `exirc inspect "
                 "PROGRAM` lists the names it reads")
    resolved = {}
    for key, uses in wanted.items():
        stored = data.entries[key]
        for where, tensor in uses:
            _check_layout(key, stored.layout, tensor, where, name)
        resolved[key] = stored.data
    return resolved


def _check_layout(key: str, layout: TensorLayout | None, tensor: P.Tensor, where: str,
                  name: str) -> None:
    """The stored tensor must be the program's: same dtype and sizes (so the same bytes)."""
    if tensor.allocation_info is not None:
        raise ExternalDataError(f"{where} ({key!r}) is an external tensor the program also "
                                "plans memory for (mutable external weights), which exirc's "
                                "runtime does not run", hint="compile with the weights in the "
                                "program, or run it on ExecuTorch's runtime")
    wanted = TensorLayout.of(tensor)
    if layout is None or (layout.scalar_type, layout.sizes) != (wanted.scalar_type,
                                                                 wanted.sizes):
        stored = "bytes without a tensor layout" if layout is None else str(layout)
        raise ExternalDataError(f"{key!r} in the data file {name} is {stored}, but the program "
                                f"reads it as {wanted} ({where})",
                                hint="pass the data file this program was compiled with")


def _count(keys: Mapping[str, object] | list[str]) -> str:
    return f"{len(keys)} tensor{'s' if len(keys) != 1 else ''}"


def listed(keys: list[str], most: int = 6) -> str:
    shown = ", ".join(keys[:most])
    return shown + (f", ... {len(keys) - most} more" if len(keys) > most else "")
