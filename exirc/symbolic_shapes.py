"""Symbolic shapes stored beside a program: dims by symbol, symbols by range.

A `.pte` tensor records only the upper bound of a dynamic dim. So that
`inspect` can print `f32[s0<=64, 8]` and the runtime can refuse an input
outside its range (or breaking a relation such as `y.shape[0] == 2 * s0`),
the compiler stores, per method, each dynamic tensor's dims as expressions
and each symbol's range, as JSON in a segment named by `NAMED_DATA_KEY`.
ExecuTorch's runtime never asks for that key, so it ignores the segment.

Expressions are evaluated by a small arithmetic evaluator, never `eval`:
the file may be hostile. This module does not import torch.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exirc import json_segment

NAMED_DATA_KEY = "exirc.symbolic_shapes"
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 22
_MAX_EXPRESSION = 200

Dim = int | str  # a size, or an expression over symbols such as "2*s0"


@dataclass(frozen=True)
class SymbolRange:
    lower: int
    upper: int | None  # None: unbounded

    def describe(self) -> str:
        return f"{self.lower}..{self.upper if self.upper is not None else 'inf'}"


@dataclass
class MethodShapes:
    """The symbols of one method and the symbolic dims of its tensor values."""

    symbols: dict[str, SymbolRange] = field(default_factory=dict)
    values: dict[int, list[Dim]] = field(default_factory=dict)

    def describe_dims(self, value: int) -> list[str] | None:
        """`["s0<=64", "8"]` for a value with symbolic dims, else None."""
        dims = self.values.get(value)
        if dims is None:
            return None
        return [self._describe(d) for d in dims]

    def _describe(self, dim: Dim) -> str:
        if isinstance(dim, int):
            return str(dim)
        upper = upper_bound(dim, self.symbols)
        return f"{dim}<={upper}" if upper is not None else dim


def encode(methods: Mapping[str, MethodShapes]) -> bytes:
    return json_segment.dump({"methods": {
        name: {
            "symbols": {s: [r.lower, r.upper] for s, r in shapes.symbols.items()},
            "values": {str(i): dims for i, dims in shapes.values.items()},
        }
        for name, shapes in methods.items()
    }}, FORMAT_VERSION)


def decode(data: bytes | memoryview) -> dict[str, MethodShapes]:
    """Parse the segment; a malformed one is a FormatError, never a crash."""
    return json_segment.parse(data, key=NAMED_DATA_KEY, what="symbolic shapes",
                              version=FORMAT_VERSION, max_bytes=_MAX_BYTES, read=_methods)


def _methods(document: dict[str, Any]) -> dict[str, MethodShapes]:
    methods = {}
    for name, method in document["methods"].items():
        symbols = {str(s): SymbolRange(_int(lo), None if hi is None else _int(hi))
                   for s, (lo, hi) in method["symbols"].items()}
        values = {int(i): [_dim(d) for d in dims] for i, dims in method["values"].items()}
        methods[str(name)] = MethodShapes(symbols, values)
    return methods


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    return value


def _dim(value: Any) -> Dim:
    if isinstance(value, str):
        _parse(value)  # refuse now what could not be evaluated later
        return value
    return _int(value)


# -- evaluation -----------------------------------------------------------------

_BINARY: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_CALLS: dict[str, Callable[..., int]] = {
    "Mod": operator.mod, "PythonMod": operator.mod, "FloorDiv": operator.floordiv,
    "Max": max, "Min": min,
}


def _parse(expression: str) -> ast.expr:
    if len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"expression of {len(expression)} characters")
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    for node in ast.walk(tree):
        allowed = (ast.BinOp, ast.UnaryOp, ast.USub, ast.Constant, ast.Name, ast.Load,
                   ast.Call, *_BINARY)
        if not isinstance(node, allowed) or \
                (isinstance(node, ast.Constant) and type(node.value) is not int) or \
                (isinstance(node, ast.Call) and
                 (not isinstance(node.func, ast.Name) or node.func.id not in _CALLS)):
            raise ValueError(f"{expression!r} is not size arithmetic")
    return tree


def evaluate(expression: str, symbols: Mapping[str, int]) -> int | None:
    """The value of `expression` given `symbols`; None if a symbol is unknown."""
    def value(node: ast.expr) -> int | None:
        if isinstance(node, ast.Constant):
            return node.value if type(node.value) is int else None
        if isinstance(node, ast.Name):
            return symbols.get(node.id)
        if isinstance(node, ast.UnaryOp):
            inner = value(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                return None
            return _BINARY[type(node.op)](left, right)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        args = [value(a) for a in node.args]
        if any(a is None for a in args) or not args:
            return None
        return int(_CALLS[node.func.id](*args))

    try:
        return value(_parse(expression))
    except (ValueError, TypeError, ZeroDivisionError):
        return None


def upper_bound(expression: str, symbols: Mapping[str, SymbolRange]) -> int | None:
    """The largest value of `expression` over its symbols' ranges.

    Size expressions only grow with their symbols (sums and products of
    sizes), so the value at every symbol's upper bound is the bound.
    """
    uppers = {name: r.upper for name, r in symbols.items() if r.upper is not None}
    return evaluate(expression, uppers)


def bind_symbols(dims: list[Dim], actual: tuple[int, ...], bound: dict[str, int]) -> None:
    """Learn the symbols that are whole dims (`s0`) from an actual shape."""
    for dim, size in zip(dims, actual):
        if isinstance(dim, str) and dim.isidentifier() and dim not in bound:
            bound[dim] = size
