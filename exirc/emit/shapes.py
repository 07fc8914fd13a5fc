"""The symbolic shapes of one method, for `exirc.serialize.symbolic_shapes`.

torch names symbols after internal hashes (`s77`); a reader wants the
names the user gave them (`torch.export.Dim("batch")`), and `s0`, `s1`, ...
for the others, in the order they first appear in the method's values
(inputs first). Ranges come from the program's `range_constraints` (what export
promises the caller), else from the shape environment.
"""

from __future__ import annotations

import ast
import keyword
import re
from typing import TYPE_CHECKING, Any

import sympy

from exirc.serialize.symbolic_shapes import Dim, MethodShapes, SymbolRange

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def method_shapes(symbolic_dims: dict[int, list[Any]],
                  program: ExportedProgram) -> MethodShapes | None:
    """Readable dims and symbol ranges from value index -> dims (sympy or int)."""
    if not symbolic_dims:
        return None
    order: list[sympy.Symbol] = []
    for index in sorted(symbolic_dims):
        for dim in symbolic_dims[index]:
            if isinstance(dim, sympy.Expr):
                order += [s for s in sorted(dim.free_symbols, key=str) if s not in order]
    names = _readable_names(order, program)
    renamed = {symbol: sympy.Symbol(names[symbol], integer=True) for symbol in order}
    shapes = MethodShapes()
    for symbol, readable in renamed.items():
        shapes.symbols[str(readable)] = _range(symbol, program)
    for index, dims in symbolic_dims.items():
        shapes.values[index] = [_readable(d, renamed) for d in dims]
    return shapes


def _readable_names(symbols: list[sympy.Symbol], program: ExportedProgram) -> dict[Any, str]:
    """Each symbol's `Dim` name where the user gave one (distinct, a plain
    identifier), else the first free `s0`, `s1`, ... in order."""
    given = _dim_names(program)
    names: dict[Any, str] = {}
    for symbol in symbols:
        name = given.get(symbol)
        if name is not None and name not in names.values():
            names[symbol] = name
    generated = (f"s{k}" for k in range(len(symbols) + len(names) + 1))
    for symbol in symbols:
        if symbol not in names:
            names[symbol] = next(n for n in generated if n not in names.values())
    return {symbol: names[symbol] for symbol in symbols}


def _dim_names(program: ExportedProgram) -> dict[Any, str]:
    """Symbol -> the name of the `torch.export.Dim` behind it, from the shape
    environment's record of each input dim's debug name. A symbol known only
    by a derived dim's (`2*n`) is named from it if the dim is that expression
    of the symbol; otherwise it keeps a generated name."""
    shape_env = _shape_env(program)
    try:
        sources = shape_env.var_to_sources if shape_env is not None else {}
        debug_names = shape_env.source_name_to_debug_name if shape_env is not None else {}
        dims = _input_dims(program)
        found: dict[Any, str] = {}
        derived: dict[Any, str] = {}
        for symbol, symbol_sources in sources.items():
            for source in symbol_sources:
                # a root of derived dims only: export gives it the Dim's name as source
                name = getattr(source, "source_name", None) or debug_names.get(source.name)
                if not isinstance(name, str):
                    continue
                if _is_name(name):
                    found.setdefault(symbol, name)
                # `2*n`: the symbol is n if the dim is that expression of it
                words = {w for w in re.findall(r"[A-Za-z_]\w*", name) if _is_name(w)}
                dim = dims.get((getattr(source, "base", None), getattr(source, "idx", None)))
                if len(words) == 1 and dim is not None:
                    (word,) = words
                    named = dim.xreplace({symbol: sympy.Symbol(word, integer=True)})
                    if str(named).replace(" ", "") == name.replace(" ", ""):
                        derived.setdefault(symbol, word)
        for symbol, name in derived.items():
            if symbol not in found and name not in found.values():
                found[symbol] = name
        return found
    except (AttributeError, TypeError, ImportError):  # torch internals: names are a nicety
        return {}


def _input_dims(program: ExportedProgram) -> dict[tuple[Any, Any], Any]:
    """(the source of an input, dim) -> that dim's expression, for user inputs
    whose placeholder has the input's name (how export's sources name them)."""
    import torch
    from torch._dynamo.source import LocalSource

    dims: dict[tuple[Any, Any], Any] = {}
    for node in program.graph_module.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt):
                    dims[(LocalSource(node.name, is_input=False), d)] = size.node.expr
    return dims


def _is_name(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)


def _readable(dim: Any, renamed: dict[sympy.Symbol, sympy.Symbol]) -> Dim:
    if isinstance(dim, sympy.Expr):
        expression = dim.xreplace(renamed)
        return int(expression) if expression.is_Integer else _compact(str(expression))
    return int(dim)


def _compact(text: str) -> str:
    """sympy's `((s0//2)) + 1` as `s0//2 + 1`: re-printed without redundant parentheses."""
    try:
        printed = ast.unparse(ast.parse(text, mode="eval"))
    except SyntaxError:
        return text
    return printed.replace(" * ", "*").replace(" // ", "//")


def _range(symbol: sympy.Symbol, program: ExportedProgram) -> SymbolRange:
    bounds = program.range_constraints.get(symbol)
    if bounds is None:
        bounds = _shape_env_range(symbol, program)
    if bounds is None:
        return SymbolRange(0, None)
    lower, upper = bounds.lower, bounds.upper
    return SymbolRange(int(lower) if lower.is_finite else 0,
                       int(upper) if upper.is_finite else None)


def _shape_env_range(symbol: sympy.Symbol, program: ExportedProgram) -> Any:
    shape_env = _shape_env(program)
    return shape_env.var_to_range.get(symbol) if shape_env is not None else None


def _shape_env(program: ExportedProgram) -> Any:
    """The shape environment of the program's symbolic sizes, if any."""
    import torch

    for node in program.graph_module.graph.nodes:
        value = node.meta.get("val")
        dims = value.shape if isinstance(value, torch.Tensor) else []
        for dim in dims:
            if isinstance(dim, torch.SymInt) and dim.node.shape_env is not None:
                return dim.node.shape_env
    return None
