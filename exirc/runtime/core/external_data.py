"""A program's external data: the `.ptd` file its weights were compiled into.

A tensor whose `extra_tensor_info` says `location EXTERNAL` has no bytes in
the program: its fully qualified name is a key of a data file, which also
holds named data delegates read (an XNNPACK payload's weights). Loading
resolves every such tensor before anything else needs it, and refuses the
program, naming what is missing and what to pass, when there is no data file
or the one given does not hold the key with the tensor's dtype and shape.
Delegate weights are looked up in the program first, then in the data file;
a key in both is refused, as ExecuTorch's runtime refuses it.

`ProgramFiles` is what a loaded method keeps of the files it reads in place:
the resolved bytes, and the guards (`MappedFile.check`) it checks before each
run so that neither file can change under it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from exirc.errors import ExternalDataError
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile
from exirc.serialize.data_file.match import listed, resolve_tensors
from exirc.serialize.data_file.reader import DataSource, read_mapped_data_file
from exirc.serialize.mapped_file import MappedFile

Bytes = bytes | memoryview


class NamedData(Mapping[str, Bytes]):
    """Delegate data by key, remembering the keys looked up and not found: a
    delegate refusing its payload for want of one is then told apart from a
    malformed payload (`ProgramFiles.explain_missing`)."""

    def __init__(self, entries: Mapping[str, Bytes] | None = None) -> None:
        self.entries: dict[str, Bytes] = dict(entries or {})
        self.missed: list[str] = []

    def __getitem__(self, key: str) -> Bytes:
        found = self.entries.get(key)
        if found is None:
            self.missed.append(key)
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass
class ProgramFiles:
    """The program's external tensors and delegate data, and the files they are views of."""

    tensors: dict[str, Bytes] = field(default_factory=dict)  # name -> bytes, checked
    named: NamedData = field(default_factory=NamedData)  # delegate data: the program's, the file's
    guards: tuple[MappedFile, ...] = ()
    data_name: str | None = None  # how messages name the data file; None: none given

    def explain_missing(self, where: str) -> None:
        """After a delegate at `where` refused its payload: ExternalDataError if it
        looked up named data nobody has, which a data file would hold."""
        if not self.named.missed:
            return
        keys = listed(sorted(set(self.named.missed)), most=3)
        if self.data_name is None:
            raise ExternalDataError(f"{where} reads named data ({keys}) the program does not "
                                    "have: its weights are in an external data file, and none "
                                    "was given")
        raise ExternalDataError(f"{where} reads named data ({keys}) that neither the program nor "
                                f"the data file {self.data_name} has",
                                hint="pass the data file this program was compiled with")

    def check(self) -> None:
        """FormatError if a file read in place changed on disk since the load."""
        for guard in self.guards:
            guard.check()


def open_program_files(program: P.Program, mapped: MappedFile | None,
                       data: DataSource | None,
                       program_named: Mapping[str, Bytes]) -> ProgramFiles:
    """Read the data file (if any) and resolve every external tensor of `program`."""
    guards: tuple[MappedFile, ...] = (mapped,) if mapped is not None else ()
    if data is None:
        found = DataFile()
        name = None
    else:
        found, data_mapped = read_mapped_data_file(data)
        name = os.fspath(data) if isinstance(data, (str, os.PathLike)) else "the data given"
        guards += (data_mapped,) if data_mapped is not None else ()
    tensors = resolve_tensors(program, found, name)
    both = sorted(key for key in found.entries if key in program_named)
    if both:
        raise ExternalDataError(f"named data {listed(both)} is stored both in the program and "
                                f"in the data file {name}", hint="recompile the program and its "
                                "data file together: a runtime cannot know which to use")
    named = NamedData(program_named)
    named.entries.update((key, stored.data) for key, stored in found.entries.items())
    return ProgramFiles(tensors, named, guards, name)
