"""The names of each method's inputs and outputs, stored beside a program.

A `.pte` method's inputs and outputs are value indices. Users know them as
`input_ids` and `logits`: the compiler stores, per method, the forward
parameter behind each input and the path of each output in what the model
returned (`logits`, `past_key_values.0.1`), as JSON in a segment named by
`NAMED_DATA_KEY` that other runtimes ignore. `inspect` shows them and `run`
uses them for `.npz` keys and messages. A file without the segment (or
with a list of the wrong length) falls back to `input_0`, `output_0`, ...
This module does not import torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exirc.serialize import json_segment, metadata
from exirc.serialize import program as P

NAMED_DATA_KEY = "exirc.io_names"  # a key in files: never renamed
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 22
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
"""What a stored name may be: it becomes an .npz key and a word in messages,
so nothing that could be a path, markup or a terminal escape."""


@dataclass(frozen=True)
class MethodNames:
    inputs: list[str]
    outputs: list[str]

    def input(self, position: int) -> str:
        return _pick(self.inputs, position, "input")

    def output(self, position: int) -> str:
        return _pick(self.outputs, position, "output")


def _pick(names: Sequence[str], position: int, kind: str) -> str:
    return names[position] if 0 <= position < len(names) else f"{kind}_{position}"


def default_names(inputs: int, outputs: int) -> MethodNames:
    return MethodNames([f"input_{i}" for i in range(inputs)],
                       [f"output_{i}" for i in range(outputs)])


def usable(names: Sequence[str]) -> bool:
    """Whether every name is a valid, distinct name (else the defaults are used)."""
    return len(set(names)) == len(names) and all(_NAME.fullmatch(n) for n in names)


def stored_io_names(program: P.Program) -> dict[str, MethodNames]:
    """Method name -> the names a program stores (none in other files); a
    malformed segment is a FormatError."""
    data = metadata.stored(program, NAMED_DATA_KEY)
    return decode(data) if data is not None else {}


def encode(methods: Mapping[str, MethodNames]) -> bytes:
    return json_segment.dump({"methods": {
        name: {"inputs": names.inputs, "outputs": names.outputs}
        for name, names in methods.items()}}, FORMAT_VERSION)


def decode(data: bytes | memoryview) -> dict[str, MethodNames]:
    """Method name -> its names; a malformed segment is a FormatError."""
    return json_segment.parse(data, key=NAMED_DATA_KEY, what="input and output names",
                              version=FORMAT_VERSION, max_bytes=_MAX_BYTES, read=_methods)


def method_names(methods: Mapping[str, MethodNames], method: str, inputs: int,
                 outputs: int) -> MethodNames:
    """The stored names of `method` where they fit its `inputs` and `outputs`
    counts and are usable; the defaults (`input_0`, ...) otherwise."""
    stored = methods.get(method)
    fallback = default_names(inputs, outputs)
    if stored is None:
        return fallback
    return MethodNames(
        stored.inputs if len(stored.inputs) == inputs and usable(stored.inputs)
        else fallback.inputs,
        stored.outputs if len(stored.outputs) == outputs and usable(stored.outputs)
        else fallback.outputs)


def _methods(document: dict[str, Any]) -> dict[str, MethodNames]:
    methods = {}
    for name, entry in document["methods"].items():
        lists = [entry["inputs"], entry["outputs"]]
        for listed in lists:
            if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
                raise ValueError(f"the names of method {name!r} are not lists of strings")
        methods[name] = MethodNames(*lists)
    return methods
