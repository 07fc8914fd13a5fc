"""Real operators to swap a program's operators for.

Two pools, both of operators that exist: the kernel lists of exirc's targets
(what the runtime allows, so a swap reaches a kernel with arguments meant for
another), and every ATen operator torch registers (mostly refused by the
runtime's allowlist, which is what such a swap tests). Each operator keeps its
schema's argument count, so a swap can prefer operators of the same arity,
whose argument lists bind and so go deepest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from exirc.targets import kernel_list

KERNEL_SETS = ("portable", "quantized")


@dataclass(frozen=True)
class Op:
    """`aten::add`, `out`, and how many arguments its schema has (outs included)."""

    name: str
    overload: str
    arity: int


@dataclass
class Catalog:
    allowed: list[Op] = field(default_factory=list)
    aten: list[Op] = field(default_factory=list)
    by_arity: dict[int, list[Op]] = field(default_factory=dict)
    overloads: dict[str, list[str]] = field(default_factory=dict)  # name -> its overloads


def build_catalog() -> Catalog:
    """Every ATen operator torch has a schema for, and the targets' kernel lists."""
    import torch

    schemas = {}
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith(("aten::", "quantized_decomposed::")):
            schemas[(schema.name, schema.overload_name)] = len(schema.arguments)
    catalog = Catalog()
    overloads: dict[str, list[str]] = defaultdict(list)
    arity: dict[int, list[Op]] = defaultdict(list)
    for (name, overload), count in sorted(schemas.items()):
        op = Op(name, overload, count)
        overloads[name].append(overload)
        arity[count].append(op)
        if name.startswith("aten::"):
            catalog.aten.append(op)
    allowed = sorted({line for kernel_set in KERNEL_SETS for line in kernel_list(kernel_set)})
    for qualified in allowed:
        name, _, overload = qualified.partition(".")
        catalog.allowed.append(Op(name, overload, schemas.get((name, overload), 0)))
    catalog.by_arity = dict(arity)
    catalog.overloads = dict(overloads)
    return catalog
