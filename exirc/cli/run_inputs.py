"""`exirc run`'s inputs: read from .npy/.npz files (checked against the
method's signature first), or made up at random (`--random`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from exirc.errors import UsageError

if TYPE_CHECKING:
    import torch

    from exirc.runtime.core.inputs import InputSpec
    from exirc.runtime.core.method import Method
    from exirc.serialize.npy_expected import ExpectedArray


def read_inputs(method: Method, paths: tuple[str, ...]) -> Sequence[Any] | dict[str, Any]:
    from exirc.serialize.npy import load_array_files, load_arrays

    specs = method.inputs
    if not paths:
        if specs:
            raise UsageError(f"method {method.name!r} takes {len(specs)} input"
                             f"{'s' if len(specs) > 1 else ''} ({method.signature()})",
                             hint="give them with --inputs FILE, or use --random")
        return []
    from exirc.serialize.npy_expected import ExpectedArrays

    # Every header is checked against the signature before any data is read
    # (or decompressed): a wrong input costs a few hundred bytes, whatever it claims.
    expected = ExpectedArrays(f"method {method.name!r}",
                              [_expected_array(spec) for spec in specs],
                              method.shapes.symbols if method.shapes is not None else {})
    if len(paths) == 1 and paths[0].endswith(".npz"):
        return load_arrays(paths[0], expected)
    npz = [path for path in paths if path.endswith(".npz")]
    if npz:
        raise UsageError(f"{npz[0]}: a .npz holds all the inputs; give it as the only --inputs")
    return load_array_files(paths, expected)


def _expected_array(spec: InputSpec) -> ExpectedArray:
    """What the file of input `spec` must hold, as its .npy header will say it."""
    from exirc.runtime.core.arenas import numpy_dtype
    from exirc.serialize.npy_expected import ExpectedArray

    signature = spec.describe()
    if spec.kind != "tensor" or spec.dtype is None:
        kinds = {"int": "iu", "float": "iuf", "bool": "b"}.get(spec.kind, "")
        return ExpectedArray(spec.name, signature, (), kinds=kinds)
    return ExpectedArray(spec.name, signature, spec.shape, at_most=spec.dynamic,
                         dtype=numpy_dtype(spec.dtype), symbol_dims=spec.symbol_dims)


def make_random_inputs(method: Method, seed: int,
                       requested: Mapping[str, tuple[int, ...]]) -> list[Any]:
    """Standard-normal floats, and 0 or 1 for integers and bools (safe as indices),
    of the shapes `random_shapes` picks (`requested`: --shape's, by input)."""
    import math

    import numpy
    import torch

    from exirc.cli.random_shapes import random_shapes
    from exirc.runtime.machine import available_memory

    specs = method.inputs
    shapes = random_shapes(method.name, specs, method.shapes, requested)
    needed = sum(math.prod(shape) * spec.dtype.itemsize for spec, shape in zip(specs, shapes)
                 if spec.dtype is not None)
    available = available_memory()
    if available is not None and needed > available // 2:
        raise UsageError(f"random inputs of these shapes need {needed} bytes, more than half "
                         "the memory available", hint="give the inputs with --inputs")
    rng = numpy.random.default_rng(seed)
    values: list[Any] = []
    for spec, shape in zip(specs, shapes):
        if spec.kind == "int":
            values.append(1)
        elif spec.kind == "float":
            values.append(float(rng.standard_normal()))
        elif spec.kind == "bool":
            values.append(bool(rng.integers(0, 2)))
        elif spec.dtype is not None and spec.dtype.is_floating_point:
            floats = rng.standard_normal(shape, dtype=numpy.float32)
            values.append(torch.from_numpy(floats).to(spec.dtype))
        else:
            assert spec.dtype is not None  # a tensor spec always has one
            integers = torch.from_numpy(rng.integers(0, 2, size=shape))
            values.append(_as_dtype(integers, spec.dtype))
    return values


def _as_dtype(integers: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`integers` converted to `dtype`, or, for element types torch cannot convert
    to (bits16), the same small values as unsigned integers of its width, reinterpreted."""
    import torch

    try:
        return integers.to(dtype)
    except (NotImplementedError, RuntimeError):
        unsigned = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
        return integers.to(unsigned[dtype.itemsize]).view(dtype)
