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
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exirc.errors import InputError
from exirc.serialize import json_segment, metadata
from exirc.serialize import program as P

NAMED_DATA_KEY = "exirc.symbolic_shapes"  # a key in files: never renamed
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 22
_MAX_EXPRESSION = 200
# Sizes and symbol bounds a file may state: int64's range, what sizes are.
# A bound of 10**4000 would make every value computed from it huge (and
# Python refuses to print ints of more than 4300 digits).
MAX_SIZE = (1 << 63) - 1

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


def stored_symbolic_shapes(program: P.Program) -> dict[str, MethodShapes]:
    """Method name -> the symbolic shapes a program stores (none in other
    files); a malformed segment is a FormatError."""
    data = metadata.stored(program, NAMED_DATA_KEY)
    return decode(data) if data is not None else {}


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
        raise ValueError(f"{value!r:.40} is not an integer")
    if not -MAX_SIZE <= value <= MAX_SIZE:
        raise ValueError("an integer beyond int64 is not a size or a bound")
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


@functools.lru_cache(maxsize=4096)
def _parse(expression: str) -> ast.expr:
    """The tree of a size expression (cached: a listing describes the same few
    expressions at every instruction). Trees are never changed."""
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
    try:
        return _value(_parse(expression), symbols)
    except ValueError:
        return None


def _value(tree: ast.expr, symbols: Mapping[str, int]) -> int | None:
    """The value of a tree `_parse` accepted; None if a symbol is unknown."""
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
        result = value(tree)
    except (ValueError, TypeError, ZeroDivisionError, OverflowError):
        return None
    # Past int64 no real size lies: say "unknown" rather than carry the number.
    return result if result is None or -MAX_SIZE <= result <= MAX_SIZE else None


def upper_bound(expression: str, symbols: Mapping[str, SymbolRange]) -> int | None:
    """The largest value of `expression` over its symbols' ranges.

    Size expressions only grow with their symbols (sums and products of
    sizes), so the value at every symbol's upper bound is the bound.
    """
    uppers = {}
    for name in free_symbols(expression):  # only its own: a file may state many
        found = symbols.get(name)
        if found is not None and found.upper is not None:
            uppers[name] = found.upper
    return evaluate(expression, uppers)


def bind_symbols(dims: list[Dim], actual: tuple[int, ...], bound: dict[str, int]) -> None:
    """Learn the symbols that are whole dims (`s0`) from an actual shape."""
    for dim, size in zip(dims, actual):
        if isinstance(dim, str) and dim.isidentifier() and dim not in bound:
            bound[dim] = size


# -- checking actual sizes against the dims ---------------------------------------

_MAX_SCAN = 1 << 12  # a range searched value by value when bisection fails


def free_symbols(expression: str) -> list[str]:
    """The symbols of `expression`, in order of first appearance (`Max` is no symbol)."""
    try:
        tree = _parse(expression)
    except ValueError:
        return []
    functions = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and id(node) not in functions and node.id not in names:
            names.append(node.id)
    return names


@dataclass(frozen=True)
class InputDims:
    """One input's dims (`["s0", 8]`) and the shape it was given."""

    name: str  # `input_0`
    dims: tuple[Dim, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Binding:
    """A symbol's value at run time, and the dim it was read from."""

    value: int
    source: str  # `input_0 dim 0`
    expression: str  # the dim's expression there: `s0`, or `2*s0` when solved for


@dataclass(frozen=True)
class DimProblem:
    """An actual size that breaks a dim's constraint; `message` names the input and dim."""

    message: str
    kind: str  # "range" (a symbol outside its range), "static" or "relation"


def check_dims(symbols: Mapping[str, SymbolRange],
               inputs: list[InputDims]) -> tuple[dict[str, Binding], list[DimProblem]]:
    """Check every dim of `inputs` against the method's symbols: static dims equal,
    each symbol within its range and one value wherever it appears, each derived
    dim (`2*s0`, `s0 + 1`) equal to its expression.

    A symbol takes its value from the first dim that is the symbol alone, else
    it is solved for from the first dim that is an expression of it and of
    symbols already known. Returns the bindings and every problem, in input order.
    """
    sites = [(f"{entry.name} dim {d}", dim, size)
             for entry in inputs for d, (dim, size) in enumerate(zip(entry.dims, entry.shape))]
    bound: dict[str, Binding] = {}
    for where, dim, size in sites:
        if isinstance(dim, str) and dim.isidentifier() and dim not in bound:
            bound[dim] = Binding(size, where, dim)
    unsolvable: dict[str, str] = {}  # where -> why its expression has no solution
    progress = True
    while progress:
        progress = False
        for where, dim, size in sites:
            if not isinstance(dim, str) or where in unsolvable:
                continue
            unknown = [s for s in free_symbols(dim) if s not in bound]
            if len(unknown) != 1:
                continue
            symbol = unknown[0]
            limits = symbols.get(symbol, SymbolRange(0, None))
            value = _solve(dim, symbol, size, {s: b.value for s, b in bound.items()}, limits)
            if value is None:
                unsolvable[where] = f"{symbol} in {limits.describe()}"
                continue
            bound[symbol] = Binding(value, where, dim)
            progress = True

    problems: list[DimProblem] = []
    values = {s: b.value for s, b in bound.items()}
    for where, dim, size in sites:
        if isinstance(dim, int):
            if size != dim:
                problems.append(DimProblem(f"{where} is {size}, but must be {dim}", "static"))
            continue
        for symbol in free_symbols(dim):
            binding, allowed = bound.get(symbol), symbols.get(symbol)
            if binding is None or allowed is None or binding.source != where or \
                    _within(binding.value, allowed):
                continue  # a symbol's range is checked where it was bound
            solved = "" if binding.expression == symbol else \
                f" = {binding.expression}, so {symbol} = {binding.value}"
            problems.append(DimProblem(
                f"{where} is {size}{solved}, but {symbol} must be in {allowed.describe()}",
                "range"))
        if where in unsolvable:
            problems.append(DimProblem(f"{where} is {size}, but must be {dim} for some "
                                       f"{unsolvable[where]}", "relation"))
            continue
        expected = evaluate(dim, values)
        if expected is None or expected == size:
            continue
        why = "; ".join(_bound_by(s, bound[s]) for s in free_symbols(dim) if s in bound)
        if dim.isidentifier():  # `s0 = 3 (bound by input_0 dim 0)`
            why = why.removeprefix(f"{dim} = {bound[dim].value}, ")
        problems.append(DimProblem(f"{where} is {size}, but must be {dim} = {expected} ({why})",
                                   "relation"))
    return bound, problems


def _bound_by(symbol: str, binding: Binding) -> str:
    """`s0 = 3, bound by input_0 dim 0` (`... dim 0 = 2*s0` when solved for)."""
    solved = f" = {binding.expression}" if binding.expression != symbol else ""
    return f"{symbol} = {binding.value}, bound by {binding.source}{solved}"


def _within(value: int, limits: SymbolRange) -> bool:
    return value >= limits.lower and (limits.upper is None or value <= limits.upper)


def _solve(expression: str, symbol: str, size: int, known: Mapping[str, int],
           limits: SymbolRange) -> int | None:
    """The smallest value of `symbol` in `limits` for which `expression` is `size`.

    By bisection, as size expressions never shrink when their symbols grow;
    failing that (an expression that does), a small range value by value.
    """
    tree = _parse(expression)
    values = dict(known)

    def at(value: int) -> int | None:
        values[symbol] = value
        return _value(tree, values)

    lower = limits.lower
    upper = limits.upper
    if upper is None:  # unbounded: find a value at which the expression reaches `size`
        upper = max(lower, 1)
        while (reached := at(upper)) is not None and reached < size and upper < 1 << 62:
            upper *= 2
    low, high = lower, upper
    while low < high:
        middle = (low + high) // 2
        reached = at(middle)
        if reached is None:
            break
        if reached < size:
            low = middle + 1
        else:
            high = middle
    if low <= upper and at(low) == size:
        return low
    if upper - lower <= _MAX_SCAN:
        return next((v for v in range(lower, upper + 1) if at(v) == size), None)
    return None


_MAX_PROBLEMS = 4  # dim problems named in one message
_DIM_HINTS = {
    "range": "the program was compiled for that range; recompile with a wider "
             "torch.export.Dim(min=..., max=...) to accept this size",
    "static": "that dim was static when the program was exported; give it a "
              "torch.export.Dim in dynamic_shapes and recompile to vary it",
    "relation": "inputs sharing a symbol must have related sizes, as when the program "
                "was exported",
}


def dim_problems_error(problems: Sequence[DimProblem], context: str) -> InputError:
    """One InputError naming the first few of `check_dims`' problems, with the
    hint for the first; `context` (`method 'forward': input_0: f32[s0, 8]`)
    closes the message. The runtime and the input-file reader share it, so a
    bad input reads the same whichever finds it."""
    shown = [problem.message for problem in problems[:_MAX_PROBLEMS]]
    if len(problems) > _MAX_PROBLEMS:
        shown.append(f"and {len(problems) - _MAX_PROBLEMS} more")
    return InputError(f"{'; '.join(shown)} ({context})", hint=_DIM_HINTS[problems[0].kind])
