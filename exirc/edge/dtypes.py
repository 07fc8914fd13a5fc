"""Edge op dtype constraints: loading `dtype_constraints.yaml` and checking nodes.

An Edge op is a core ATen op with dtype specialization. Its constraints are
written in the Edge dialect's DSL (one YAML entry per op, generated from
torch by `gen_dtype_constraints.py`):

    - func: sigmoid
      namespace: edge
      inherits: aten::sigmoid
      type_alias:
        T0: [Bool, Byte, Char, Short, Int, Long]
        T1: [Float]
        T2: [Half, BFloat16, Float, Double]
      type_constraint:
      - {self: T0, __ret_0: T1}
      - {self: T2, __ret_0: T2}

A `type_constraint` row maps tensor arguments (by schema name) and outputs
(`__ret_0`, `__ret_1`, ...) to aliases. An alias is a type variable: within
a row, keys naming the same alias have the same dtype, chosen from the
alias's set. A node is accepted when some row accepts it. A key the node
has no tensor for (an omitted optional, a Python number where the schema
says Tensor) and a tensor the row does not name are not checked; a tensor
list is checked element by element. An entry with `permissive: <reason>`
was not measured (its rows accept every dtype) and says why.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import yaml
from torch.fx import GraphModule, Node

from exirc.edge.ops import is_quantize_op, qualified_name
from exirc.errors import DialectError
from exirc.ir.source import source_location

# The dtypes the DSL names, in the order the YAML lists them (c10's ScalarType names).
DTYPES: dict[str, torch.dtype] = {
    "Bool": torch.bool,
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Short": torch.int16,
    "Int": torch.int32,
    "Long": torch.int64,
    "Half": torch.float16,
    "BFloat16": torch.bfloat16,
    "Float": torch.float32,
    "Double": torch.float64,
    "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128,
}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

CONSTRAINTS_FILE = "dtype_constraints.yaml"
QUANTIZED_CONSTRAINTS_FILE = "quantized_dtype_constraints.yaml"  # the Q/DQ ops, by hand
_SHOWN_ROWS = 3  # allowed combinations an error message lists


class EdgeDtypeError(DialectError):
    """A node of an Edge graph breaks its op's dtype constraints, or is not an Edge op."""

    exit_code = 3
    code = "E0320"


@dataclass(frozen=True)
class OpConstraints:
    """The dtype constraints of one Edge op, as read from the YAML."""

    name: str  # "aten::add.Tensor"; "aten::sigmoid" for a default overload
    aliases: Mapping[str, frozenset[torch.dtype]]
    rows: tuple[Mapping[str, str], ...]  # key (argument or __ret_N) -> alias
    permissive: str | None = None

    def allows(self, found: Mapping[str, Sequence[torch.dtype]]) -> bool:
        """Whether some row accepts the dtypes `found` (key -> dtypes of its tensors)."""
        return any(self._row_allows(row, found) for row in self.rows)

    def _row_allows(self, row: Mapping[str, str], found: Mapping[str, Sequence[torch.dtype]]
                    ) -> bool:
        bound: dict[str, torch.dtype] = {}
        for key, alias in row.items():
            dtypes = found.get(key, ())
            if not all(dtype in self.aliases[alias] for dtype in dtypes):
                return False
            if len(set(dtypes)) != 1:
                continue  # nothing to bind: no tensor, or a list of mixed dtypes
            if bound.setdefault(alias, dtypes[0]) != dtypes[0]:
                return False
        return True

    def explain(self, found: Mapping[str, Sequence[torch.dtype]]) -> str:
        """Why `found` is rejected, short: the outputs the inputs would give, or
        (when the inputs are the problem) the rows closest to them."""
        inputs = {key: dtypes for key, dtypes in found.items() if not key.startswith("__ret_")}
        if self.allows(inputs):
            outputs = []
            for key in found.keys() - inputs.keys():
                possible = [d for d in DTYPES.values() if self.allows({**inputs, key: (d,)})]
                outputs.append(f"{key}: {_names(possible)}")
            return "with these inputs it gives " + ", ".join(sorted(outputs))

        def fit(row: Mapping[str, str]) -> int:
            return sum(all(d in self.aliases[alias] for d in found.get(key, ()))
                       for key, alias in row.items())

        closest = sorted(self.rows, key=fit, reverse=True)[:_SHOWN_ROWS]
        more = len(self.rows) - len(closest)
        return "allowed: " + "; ".join(self.describe_row(r) for r in closest) + \
            (f"; and {more} more" if more > 0 else "")

    def describe_row(self, row: Mapping[str, str]) -> str:
        """`(self: Float|Double, __ret_0: same as self)`: one row, aliases spelled out."""
        parts = []
        first_key: dict[str, str] = {}
        for key, alias in row.items():
            if alias in first_key:
                parts.append(f"{key}: same as {first_key[alias]}")
            else:
                first_key[alias] = key
                parts.append(f"{key}: {_names(self.aliases[alias])}")
        return "(" + ", ".join(parts) + ")"


def _names(dtypes: Iterable[torch.dtype]) -> str:
    """`Float|Double`, or `any` for every real dtype."""
    wanted = set(dtypes)
    if all(d in wanted for d in DTYPES.values() if not d.is_complex):
        return "any"
    return "|".join(name for name, d in DTYPES.items() if d in wanted) or "none"


@functools.cache
def all_constraints() -> Mapping[str, OpConstraints]:
    """Every Edge op's constraints by op name; the YAML is read once, on first use."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = []
    for file in (CONSTRAINTS_FILE, QUANTIZED_CONSTRAINTS_FILE):
        text = importlib.resources.files("exirc.edge").joinpath(file).read_text()
        entries += yaml.load(text, Loader=loader)
    return {entry["inherits"]: _parse_entry(entry) for entry in entries}


def _parse_entry(entry: Mapping[str, Any]) -> OpConstraints:
    aliases = {
        alias: frozenset(DTYPES[name] for name in names)
        for alias, names in (entry.get("type_alias") or {}).items()
    }
    rows = tuple(dict(row) for row in entry.get("type_constraint") or ())
    return OpConstraints(entry["inherits"], aliases, rows, entry.get("permissive"))


def constraints_for(op: torch._ops.OpOverload) -> OpConstraints | None:
    """The constraints of `op`, or None when it is not an Edge op."""
    return all_constraints().get(qualified_name(op))


# --------------------------------------------------------------------------
# Reading a node's dtypes.
# --------------------------------------------------------------------------


def is_tensor_type(jit_type: Any) -> bool:
    """Tensor, Tensor?, Tensor[] and Tensor?[] schema types."""
    return "Tensor" in str(jit_type)


def bind_arguments(schema: torch._C.FunctionSchema, args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Schema argument name -> value given (defaults are left out)."""
    bound = {}
    for index, argument in enumerate(schema.arguments):
        if not argument.kwarg_only and index < len(args):
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
    return bound


def _dtypes_of(value: Any) -> tuple[torch.dtype, ...]:
    """The dtypes of the tensors in a node argument or a `meta["val"]`."""
    if isinstance(value, Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (value.dtype,)
    if isinstance(value, (list, tuple)):
        return tuple(dtype for item in value for dtype in _dtypes_of(item))
    return ()


def node_dtypes(node: Node) -> dict[str, tuple[torch.dtype, ...]]:
    """Key (tensor argument name or `__ret_N`) -> the dtypes of its tensors."""
    op = node.target
    assert isinstance(op, torch._ops.OpOverload), node
    schema = op._schema
    found: dict[str, tuple[torch.dtype, ...]] = {}
    bound = bind_arguments(schema, node.args, node.kwargs)
    for argument in schema.arguments:
        if is_tensor_type(argument.type):
            dtypes = _dtypes_of(bound.get(argument.name))
            if dtypes:
                found[argument.name] = dtypes
    value = node.meta.get("val")
    outputs = [value] if len(schema.returns) == 1 else list(value or ())
    for index, (ret, output) in enumerate(zip(schema.returns, outputs)):
        dtypes = _dtypes_of(output) if is_tensor_type(ret.type) else ()
        if dtypes:
            found[f"__ret_{index}"] = dtypes
    return found


def _format_found(found: Mapping[str, Sequence[torch.dtype]]) -> str:
    parts = []
    for key, dtypes in found.items():
        names = [DTYPE_NAMES.get(d, str(d)) for d in dtypes]
        parts.append(f"{key}: {names[0] if len(set(names)) == 1 else '[' + ', '.join(names) + ']'}")
    return ", ".join(parts)


def _where(node: Node) -> str:
    location = source_location(node)
    return f" at {location}" if location else ""


# --------------------------------------------------------------------------
# The checks.
# --------------------------------------------------------------------------


def check_node(node: Node) -> None:
    """Raise EdgeDtypeError unless `node` (an aten op call) meets its op's constraints."""
    op = node.target
    assert isinstance(op, torch._ops.OpOverload), node
    constraints = constraints_for(op)
    if constraints is None:
        raise EdgeDtypeError(
            f"node %{node.name}: {qualified_name(op)} is not an Edge op "
            f"(it has no dtype constraints){_where(node)}",
            hint="decompose it into core ATen ops, or if the pipeline keeps it on purpose, "
                 "add it to EXTRA_OPS in tools/gen_dtype_constraints.py and regenerate")
    found = node_dtypes(node)
    if constraints.allows(found):
        return
    raise EdgeDtypeError(
        f"node %{node.name}: {constraints.name} does not accept dtypes ({_format_found(found)})"
        f"{_where(node)}; {constraints.explain(found)}",
        hint="cast the inputs (`.to(dtype)`) to a supported combination, or fix the pass "
             f"that made this node (every combination: exirc/edge/{CONSTRAINTS_FILE})")


def _aten_calls(graph_module: GraphModule) -> Iterator[Node]:
    modules: Iterable[torch.nn.Module] = graph_module.modules()
    for module in modules:  # the graph and the subgraphs of control-flow ops
        if not isinstance(module, GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
                    and (target.namespace == "aten" or is_quantize_op(target)):
                yield node


def verify_dtypes(graph_module: GraphModule, skip: Collection[Any] = ()) -> None:
    """Check every aten op call of an Edge graph (and its subgraphs) with `check_node`,
    except calls of the ops in `skip` (ops outside the Edge op set a kernel runs)."""
    for node in _aten_calls(graph_module):
        if node.target not in skip:
            check_node(node)
