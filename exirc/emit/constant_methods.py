"""Constant methods as ExecuTorch writes them: a plan with no inputs, one empty
chain, and its value as the outputs (a list of ints: one Int value an item)."""

from __future__ import annotations

import json
from typing import Any

from exirc.emit.values import scalar_value
from exirc.serialize import program as P

# A pytree spec as torch serializes it (protocol 1): a leaf, or a list of leaves.
_LEAF: dict[str, Any] = {"type": None, "context": None, "children_spec": []}


def constant_plan(name: str, value: bool | int | float | str | list[int]) -> P.ExecutionPlan:
    """The execution plan of constant method `name`, returning `value`."""
    if isinstance(value, list):
        values: list[P.EValue] = [P.Int(item) for item in value]
        spec: dict[str, Any] = {"type": "builtins.list", "context": "null",
                                "children_spec": [_LEAF] * len(value)}
    else:
        values, spec = [scalar_value(value)], _LEAF
    return P.ExecutionPlan(
        name, values=values, inputs=[], outputs=list(range(len(values))),
        chains=[P.Chain()], non_const_buffer_sizes=[0],
        container_meta_type=P.ContainerMetadata("", json.dumps([1, spec])))

