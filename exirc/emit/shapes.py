"""The symbolic shapes of one method, for `exirc.serialize.symbolic_shapes`.

torch names symbols after internal hashes (`s77`); a reader wants `s0`,
`s1`, ... in the order they first appear in the method's values (inputs
first). Ranges come from the program's `range_constraints` (what export
promises the caller), else from the shape environment.
"""

from __future__ import annotations

import ast
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
    renamed: dict[sympy.Symbol, sympy.Symbol] = {}
    for index in sorted(symbolic_dims):
        for dim in symbolic_dims[index]:
            if isinstance(dim, sympy.Expr):
                for symbol in sorted(dim.free_symbols, key=str):
                    if symbol not in renamed:
                        renamed[symbol] = sympy.Symbol(f"s{len(renamed)}", integer=True)
    shapes = MethodShapes()
    for symbol, readable in renamed.items():
        shapes.symbols[str(readable)] = _range(symbol, program)
    for index, dims in symbolic_dims.items():
        shapes.values[index] = [_readable(d, renamed) for d in dims]
    return shapes


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
    import torch

    for node in program.graph_module.graph.nodes:
        value = node.meta.get("val")
        dims = value.shape if isinstance(value, torch.Tensor) else []
        for dim in dims:
            if isinstance(dim, torch.SymInt) and dim.node.shape_env is not None:
                return dim.node.shape_env.var_to_range.get(symbol)
    return None
