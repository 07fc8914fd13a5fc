"""The shapes `exirc run --random` gives a method's inputs.

Static inputs get their shape. A dynamic dim gets the size `--shape NAME=2x17`
asks for, else a size its symbol may take: the symbol's upper bound, but at
most `DEFAULT_DIM_CAP` (a bound of 100,000 tokens makes inputs, and a run,
far bigger than a smoke test wants), and never below its lower bound; a
symbol without an upper bound takes its lower bound. Dims that are
expressions (`2*s0`) follow from their symbols. A file without symbolic shapes
(ExecuTorch's) records only upper bounds, which are used as they are.
Every shape is checked against the method's symbols as `run` checks inputs,
so a --shape out of range fails here, naming the input and the range allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from exirc.errors import InputError, UsageError
from exirc.serialize.io_names import default_names
from exirc.serialize.symbolic_shapes import (
    DimProblem,
    InputDims,
    SymbolRange,
    check_dims,
    dim_problems_error,
    evaluate,
    free_symbols,
)

if TYPE_CHECKING:
    from exirc.runtime.core.inputs import InputSpec
    from exirc.serialize.symbolic_shapes import MethodShapes

DEFAULT_DIM_CAP = 256  # the largest size --random picks for a dynamic dim on its own
_SHAPE = re.compile(r"(\d+(?:x\d+)*)?")


def parse_shape_options(options: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`["x=2x17", "1=3"]` -> {"x": (2, 17), "1": (3,)}; an empty shape is a 0-d input."""
    shapes: dict[str, tuple[int, ...]] = {}
    for option in options:
        name, equals, dims = option.partition("=")
        if not equals or not name or _SHAPE.fullmatch(dims.strip().lower()) is None:
            raise UsageError(f"--shape {option!r} is not NAME=SIZES",
                             hint="name an input (as `exirc inspect` shows it, or its index) "
                                  "and its sizes joined by x, e.g. --shape input_0=2x17")
        if name in shapes:
            raise UsageError(f"--shape gives {name!r} twice")
        text = dims.strip().lower()
        shapes[name] = tuple(int(d) for d in text.split("x")) if text else ()
    return shapes


def random_shapes(method: str, specs: Sequence[InputSpec], shapes: MethodShapes | None,
                  requested: Mapping[str, tuple[int, ...]]) -> list[tuple[int, ...]]:
    """A shape per input (`()` for non-tensors) for `--random`, with `requested`
    (input name or index -> shape) where given."""
    given = _by_position(method, specs, requested)
    symbols = shapes.symbols if shapes is not None else {}
    chosen: dict[str, int] = {}
    if given and shapes is not None:
        dims = [_dims(specs[i]) for i in given]
        bound, problems = check_dims(symbols, [InputDims(specs[i].name, d, given[i])
                                               for i, d in zip(given, dims)])
        _raise_for(method, specs, given, problems)
        chosen = {name: binding.value for name, binding in bound.items()}
    result: list[tuple[int, ...]] = []
    for position, spec in enumerate(specs):
        if position in given:
            result.append(given[position])
        elif spec.kind != "tensor":
            result.append(())
        elif spec.symbol_dims is not None:
            result.append(_pick(spec, symbols, chosen))
        else:
            result.append(tuple(spec.shape))  # static, or only upper bounds known
    if shapes is not None:  # the sizes picked must relate as the program's inputs do
        _, problems = check_dims(symbols, [InputDims(spec.name, _dims(spec), shape)
                                           for spec, shape in zip(specs, result)
                                           if spec.symbol_dims is not None])
        _raise_for(method, specs, given, problems)
    return result


def _by_position(method: str, specs: Sequence[InputSpec],
                 requested: Mapping[str, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """`requested` keyed by input position; a name no input has, a scalar given a
    shape or a shape of the wrong rank is a usage error."""
    # Stored names first; `input_N` and N also reach input N, as in files without names.
    positional = default_names(len(specs), 0).inputs
    names = {**{name: i for i, name in enumerate(positional)},
             **{spec.name: i for i, spec in enumerate(specs)}}
    given: dict[int, tuple[int, ...]] = {}
    for key, shape in requested.items():
        position = names.get(key, int(key) if key.isdigit() else None)
        if position is None or position >= len(specs):
            raise UsageError(f"--shape {key}: method {method!r} has no input {key!r}; its "
                             f"inputs are {_signature(specs)}",
                             hint="name an input as `exirc inspect` shows it, or by index")
        spec = specs[position]
        if position in given:
            raise UsageError(f"--shape names {spec.name} twice (by name and by index)")
        if spec.kind != "tensor":
            raise UsageError(f"--shape {key}: {spec.name} is a {spec.kind}, not a tensor")
        if len(shape) != len(spec.shape):
            raise InputError(f"--shape {key}={_text(shape)}: {spec.name} has {len(spec.shape)} "
                             f"dim{'s' if len(spec.shape) != 1 else ''} ({spec.describe()}), "
                             f"not {len(shape)}")
        if spec.symbol_dims is None:  # no symbols: the file's upper bounds are the range
            for d, (size, limit) in enumerate(zip(shape, spec.shape)):
                if size > limit or (not spec.dynamic and size != limit):
                    allowed = f"at most {limit}" if spec.dynamic else f"{limit}"
                    raise InputError(f"--shape {key}={_text(shape)}: {spec.name} dim {d} is "
                                     f"{size}, but must be {allowed} ({spec.describe()})")
        given[position] = shape
    return given


def _pick(spec: InputSpec, symbols: Mapping[str, SymbolRange],
          chosen: dict[str, int]) -> tuple[int, ...]:
    """Sizes for `spec`'s dims, choosing a value for each symbol not chosen yet."""
    sizes = []
    for d, dim in enumerate(_dims(spec)):
        if isinstance(dim, int):
            sizes.append(dim)
            continue
        for symbol in free_symbols(dim):
            if symbol not in chosen:
                chosen[symbol] = _default(symbols.get(symbol))
        value = evaluate(dim, chosen)
        sizes.append(spec.shape[d] if value is None else min(value, spec.shape[d]))
    return tuple(sizes)


def _default(limits: SymbolRange | None) -> int:
    if limits is None:
        return DEFAULT_DIM_CAP
    if limits.upper is None:
        return limits.lower
    return max(limits.lower, min(limits.upper, DEFAULT_DIM_CAP))


def _dims(spec: InputSpec) -> tuple[int | str, ...]:
    return spec.symbol_dims if spec.symbol_dims is not None else tuple(spec.shape)


def _raise_for(method: str, specs: Sequence[InputSpec], given: Mapping[int, tuple[int, ...]],
               problems: Sequence[DimProblem]) -> None:
    """An InputError for `check_dims`' problems, blaming --shape if it gave sizes."""
    if not problems:
        return
    shown = ", ".join(f"{specs[i].name}={_text(shape)}" for i, shape in given.items())
    error = dim_problems_error(problems, f"method {method!r}: {_signature(specs)}")
    prefix = f"--shape {shown}: " if shown else "--random could not pick sizes: "
    hint = ("choose sizes within the ranges shown, or leave an input out for --random to pick"
            if shown else "give the dynamic inputs' sizes with --shape NAME=SIZES")
    raise InputError(prefix + error.message, hint=hint)


def _signature(specs: Sequence[InputSpec]) -> str:
    return ", ".join(f"{spec.name}: {spec.describe()}" for spec in specs) or "none"


def _text(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))
