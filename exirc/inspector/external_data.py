"""What a program keeps in an external data file, and whether the one given has it.

`inspect` lists the tensors a program reads by name from a `.ptd` (it runs
nowhere without them) and the named data its delegates read that the program
does not hold (a delegate's weights kept in the data file). Given the data
file (`--data`), it checks it as loading does: every external tensor there
with the program's dtype and sizes, every delegate key in one of the two
files; otherwise ExternalDataError names what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exirc.errors import ExternalDataError
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile, TensorLayout
from exirc.serialize.data_file.match import external_tensors, listed, resolve_tensors

_NAMES_SHOWN = 64  # names listed in the JSON; `tensors` counts them all


def external_data_facts(program: P.Program, key_users: Mapping[str, int],
                        data: tuple[DataFile, str, int] | None) -> dict[str, Any] | None:
    """`external_data` of `inspect --json`, or None for a program that reads none
    (and no data file given). `data`: the data file, its path and size."""
    wanted = external_tensors(program)
    held = {named.key for named in program.named_data}
    outside = sorted(key for key in key_users if key not in held)
    if not wanted and not outside and data is None:
        return None
    facts: dict[str, Any] = {
        "tensors": len(wanted),
        "tensor_bytes": sum(TensorLayout.of(uses[0][1]).nbytes for uses in wanted.values()),
        "names": list(wanted)[:_NAMES_SHOWN],
        "delegate_keys": len(outside),
        "data_file": None,
    }
    if data is not None:
        found, path, size = data
        resolve_tensors(program, found, path)  # ExternalDataError if it is not this program's
        missing = [key for key in outside if key not in found.entries]
        if missing:
            raise ExternalDataError(f"the program's delegates read {len(missing)} named data "
                                    f"keys that neither it nor the data file {path} has "
                                    f"({listed(missing, most=3)})",
                                    hint="pass the data file this program was compiled with")
        facts["data_file"] = {"path": path, "size": size, "entries": len(found.entries)}
    return facts


def external_data_line(facts: dict[str, Any]) -> str:
    """The summary's line: what the program reads from outside, and from where."""
    parts = []
    if facts["tensors"]:
        names = listed(facts["names"], most=3)
        parts.append(f"{facts['tensors']} tensor{'s' if facts['tensors'] != 1 else ''} "
                     f"({names})")
    if facts["delegate_keys"]:
        parts.append(f"{facts['delegate_keys']} delegate weight"
                     f"{'s' if facts['delegate_keys'] != 1 else ''}")
    read = " and ".join(parts) or "nothing"
    data = facts["data_file"]
    if data is None:
        return f"{read} in a data file; run with --data FILE.ptd"
    return f"{read} in {data['path']} ({data['entries']} entries, all found)"
