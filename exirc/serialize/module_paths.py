"""Which submodule of the model each instruction came from, stored beside a program.

An instruction's source frames say which line made it; for a model from a
library every line is the library's, so the compiler also stores the
submodule (`transformer.h.0.attn.c_attn`, as `model.get_submodule` names
it) of each instruction: as JSON in a segment named by `NAMED_DATA_KEY`,
which other runtimes ignore. Paths are stored once, in a table; each
method has, per chain, one index into the table per instruction (0 is the
empty path: the model itself, or not known).

Reading is reading untrusted input: a segment too big or of the wrong shape,
an index outside the table or a path that is not a plain dotted name (it
becomes a word in messages: no markup, no terminal escapes) is a
FormatError. A method whose chains do not match the plan's (another tool
rewrote the program) gets no paths. This module does not import torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exirc.serialize import json_segment, metadata
from exirc.serialize import program as P

NAMED_DATA_KEY = "exirc.module_paths"  # a key in files: never renamed
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 24
_PATH = re.compile(r"[A-Za-z0-9_.\-]{0,500}")
"""What a stored path may be: dotted attribute names and indices."""


def usable(path: str) -> bool:
    """Whether `path` can be stored (others are stored as unknown)."""
    return bool(_PATH.fullmatch(path))


@dataclass(frozen=True)
class ModulePaths:
    """Per method, per chain, the module path of each instruction."""

    methods: dict[str, list[list[str]]]

    def of_method(self, method: str, chain_lengths: Sequence[int]) -> list[list[str]] | None:
        """The paths of `method`'s chains, if they fit chains of those lengths."""
        chains = self.methods.get(method)
        if chains is None or [len(c) for c in chains] != list(chain_lengths):
            return None
        return chains

    def of_plan(self, plan: P.ExecutionPlan) -> list[list[str]] | None:
        """The paths of each chain's instructions of `plan`, if stored and they fit."""
        return self.of_method(plan.name, [len(chain.instructions) for chain in plan.chains])


def stored_module_paths(program: P.Program) -> ModulePaths:
    """The paths a program stores (none in other files); a malformed segment
    is a FormatError."""
    data = metadata.stored(program, NAMED_DATA_KEY)
    return decode(data) if data is not None else ModulePaths({})


def encode(methods: Mapping[str, Sequence[Sequence[str]]]) -> bytes:
    """The segment for per method, per chain, each instruction's path ("" if none)."""
    table: dict[str, int] = {"": 0}
    indexed = {name: [[table.setdefault(p if usable(p) else "", len(table)) for p in chain]
                      for chain in chains]
               for name, chains in methods.items()}
    return json_segment.dump({"paths": list(table), "methods": indexed}, FORMAT_VERSION)


def decode(data: bytes | memoryview) -> ModulePaths:
    """The stored paths; a malformed segment is a FormatError."""
    return json_segment.parse(data, key=NAMED_DATA_KEY, what="module paths",
                              version=FORMAT_VERSION, max_bytes=_MAX_BYTES, read=_read)


def _read(document: dict[str, Any]) -> ModulePaths:
    paths = document["paths"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and usable(p) for p in paths):
        raise ValueError("the path table is not a list of dotted names")
    methods = document["methods"]
    if not isinstance(methods, dict):
        raise ValueError("methods is not an object")
    read: dict[str, list[list[str]]] = {}
    for name, chains in methods.items():
        if not isinstance(chains, list) or not all(isinstance(c, list) for c in chains):
            raise ValueError(f"the paths of method {name!r} are not lists of indices")
        read[name] = [[_path(paths, index, name) for index in chain] for chain in chains]
    return ModulePaths(read)


def _path(paths: list[str], index: Any, method: str) -> str:
    # bool is an int to Python, not to the format
    if type(index) is not int or not 0 <= index < len(paths):
        raise ValueError(f"method {method!r} has a path index {index!r} outside the table "
                         f"of {len(paths)}")
    return paths[index]
