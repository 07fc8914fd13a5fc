"""The wire layout of the node parameter tables, derived once from the model.

Every node parameter table of the format holds only uint32 scalars, float32
scalars and uint32 vectors, and the dataclasses in `nodes.py` list their
fields in slot order. So one description per class, (field name, kind) with
field i in slot i, serves the reader, the writer and the validator alike,
and a new operator needs no code here.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Literal

from exirc.errors import InternalError
from exirc.serialize.xnnpack.nodes import PARAMS_OF_KIND

FieldKind = Literal["uint", "float", "uints"]
_KINDS: dict[str, FieldKind] = {"int": "uint", "float": "float", "list[int]": "uints"}

U16 = struct.Struct("<H")
I16 = struct.Struct("<h")
F32 = struct.Struct("<f")

UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF


def _layout(cls: type) -> tuple[tuple[str, FieldKind], ...]:
    fields = []
    for f in dataclasses.fields(cls):
        kind = _KINDS.get(str(f.type))
        if kind is None:
            raise InternalError(f"{cls.__name__}.{f.name}: type {f.type} has no wire form")
        fields.append((f.name, kind))
    return tuple(fields)


PARAM_LAYOUTS: dict[type, tuple[tuple[str, FieldKind], ...]] = {
    cls: _layout(cls) for cls in set(PARAMS_OF_KIND.values())
}
"""(field name, kind) per slot, for each node parameter class."""


def camel(name: str) -> str:
    """A schema field name as flatc spells it in generated function names."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))
