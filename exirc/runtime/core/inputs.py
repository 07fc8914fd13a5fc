"""A method's inputs: what each must be (`InputSpec`), and checking what a caller gives.

`Method.run` calls `check_inputs` before anything runs: every input is
converted (numpy arrays and 0-d tensors become tensors or scalars) and
checked against its spec (kind, dtype, rank, shape within the planned
bounds), then the dims of all inputs together against the relations the
program was exported with (`symbolic_shapes`). A problem is an `InputError`
naming the input and the method's signature; nothing has been written yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from exirc.errors import FormatError, InputError
from exirc.runtime.core import arenas as memory
from exirc.serialize import program as P
from exirc.serialize.symbolic_shapes import InputDims, MethodShapes, check_dims, dim_problems_error


@dataclass(frozen=True)
class InputSpec:
    """What one method input must be; `run` checks inputs against it before running."""

    name: str  # `input_0`, ...
    value: int  # its index in the value table
    kind: str  # "tensor", "int", "float" or "bool"
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] = ()  # upper bounds when dynamic
    dynamic: bool = False
    planned: bool = True  # copied into planned memory (else the caller's memory is used)
    symbolic: tuple[str, ...] | None = None  # `s0<=64`, `8`: the dims by symbol, if known
    symbol_dims: tuple[int | str, ...] | None = None  # `s0`, `8`: the same, unadorned

    def describe(self) -> str:
        """`f32[2, 8]`, `f32[s0<=64, 8]` for a dynamic shape (`<=64` if symbols
        are unknown), or `int`."""
        if self.kind != "tensor" or self.dtype is None:
            return self.kind
        if self.symbolic is not None:
            dims = ", ".join(self.symbolic)
        else:
            dims = ", ".join(f"<={d}" if self.dynamic else str(d) for d in self.shape)
        return f"{memory.SCALAR_TYPES[self.dtype].short_name}[{dims}]"


def input_spec(plan: P.ExecutionPlan, position: int, index: int, where: str,
               shapes: MethodShapes | None) -> InputSpec:
    """The spec of input `position` of `plan`, value `index`, from the file."""
    value = plan.values[index]
    name = f"input_{position}"
    if isinstance(value, P.Tensor):
        symbolic = shapes.describe_dims(index) if shapes is not None else None
        if symbolic is not None and len(symbolic) != len(value.sizes):
            raise FormatError(f"symbolic shape of input {position} has {len(symbolic)} dims, "
                              f"the tensor {len(value.sizes)}", field=f"{where}.inputs")
        return InputSpec(name, index, "tensor", memory.torch_dtype(value.scalar_type, where),
                         tuple(value.sizes),
                         value.shape_dynamism != P.TensorShapeDynamism.STATIC,
                         value.allocation_info is not None,
                         tuple(symbolic) if symbolic is not None else None,
                         tuple(shapes.values[index]) if symbolic is not None and shapes else None)
    kinds = {P.Int: "int", P.Double: "float", P.Bool: "bool"}
    kind = kinds.get(type(value))
    if kind is None:
        raise FormatError(f"input {position} is a {type(value).__name__} value; methods take "
                          "tensors, ints, floats and bools", field=f"{where}.inputs[{position}]")
    return InputSpec(name, index, kind)


def signature(specs: Sequence[InputSpec]) -> str:
    """`input_0: f32[2, 8], input_1: int`."""
    return ", ".join(f"{spec.name}: {spec.describe()}" for spec in specs) or "none"


def check_inputs(method: str, specs: Sequence[InputSpec], shapes: MethodShapes | None,
                 inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    """Each input of method `method` converted and checked against `specs`, in
    order (`inputs` in order or by name); nothing is fed yet."""
    if isinstance(inputs, (list, tuple)):
        pass  # the common case, checked first: ABC isinstance checks are slow
    elif isinstance(inputs, Mapping):
        expected = [spec.name for spec in specs]
        if set(inputs) != set(expected) or len(inputs) != len(expected):
            raise InputError(
                f"method {method!r} takes inputs named {', '.join(expected) or 'nothing'}"
                f", got {', '.join(map(str, inputs)) or 'nothing'}",
                hint=f"give one value per input: {signature(specs)}")
        inputs = [inputs[name] for name in expected]
    elif isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise InputError(f"inputs must be a sequence or a mapping by name, got "
                         f"{type(inputs).__name__}")
    if len(inputs) != len(specs):
        raise InputError(f"method {method!r} takes {len(specs)} input"
                         f"{'' if len(specs) == 1 else 's'}, got {len(inputs)}",
                         hint=f"the method's inputs: {signature(specs)}")
    checked = [_checked(spec, value) for spec, value in zip(specs, inputs)]
    if shapes is not None:
        _check_symbols(method, specs, shapes, checked)
    return checked


def _check_symbols(method: str, specs: Sequence[InputSpec], shapes: MethodShapes,
                   inputs: list[Any]) -> None:
    """Every relation between input dims the program relies on, before it runs:
    each symbol within its range and the same wherever it appears, each derived
    dim equal to its expression, each static dim exact, and every symbolic dim
    within its planned bound (which `_checked` left to this check, so its
    message can name the symbol). All problems are reported together."""
    symbolic = [(spec, value) for spec, value in zip(specs, inputs)
                if spec.symbol_dims is not None]
    _, problems = check_dims(shapes.symbols, [
        InputDims(spec.name, spec.symbol_dims, tuple(value.shape))
        for spec, value in symbolic if spec.symbol_dims is not None])
    if problems:
        raise dim_problems_error(problems, f"method {method!r}: {signature(specs)}")
    for spec, value in symbolic:
        for d, size in enumerate(value.shape):
            if size > spec.shape[d]:  # the planned memory, whatever the file says
                raise InputError(f"{spec.name} has shape {list(value.shape)}, but dim {d} "
                                 f"may be at most {spec.shape[d]} ({spec.describe()})")


def _checked(spec: InputSpec, value: Any) -> Any:
    # The common case first, in a few attribute reads: a plain CPU tensor that is
    # exactly what a static spec asks for. Anything else takes the full checks.
    if type(value) is torch.Tensor and value.dtype is spec.dtype and value.is_cpu and \
            not spec.dynamic and value.shape == spec.shape and not value.requires_grad and \
            value.storage_offset() == 0 and value.untyped_storage().nbytes() >= value.nbytes \
            and value.is_contiguous():
        return value
    if spec.kind != "tensor":
        return _checked_scalar(spec, value)
    tensor = _as_tensor(spec, value)
    assert spec.dtype is not None
    if tensor.dtype != spec.dtype:
        raise InputError(f"{spec.name} has dtype {_dtype_name(tensor.dtype)}, expected "
                         f"{_dtype_name(spec.dtype)} ({spec.describe()})",
                         hint=f"convert it, e.g. array.astype(numpy.{_dtype_name(spec.dtype)})")
    shape = tuple(tensor.shape)
    if len(shape) != len(spec.shape):
        raise InputError(f"{spec.name} has rank {len(shape)} (shape {list(shape)}), expected "
                         f"rank {len(spec.shape)} ({spec.describe()})")
    if spec.dynamic:
        for dim, (size, bound) in enumerate(zip(shape, spec.shape)):
            if spec.symbol_dims is not None:
                continue  # checked with the symbols, whose message names them
            if size > bound:
                raise InputError(f"{spec.name} has shape {list(shape)}, but dim {dim} may be at "
                                 f"most {bound} ({spec.describe()})")
    elif shape != spec.shape:
        raise InputError(f"{spec.name} has shape {list(shape)}, expected {list(spec.shape)} "
                         f"({spec.describe()})")
    if not within_storage(tensor):
        raise InputError(f"{spec.name} addresses {extent_bytes(tensor)} bytes of its storage, "
                         f"which holds {tensor.untyped_storage().nbytes()}: its storage was "
                         "shrunk (untyped_storage().resize_) under it, and reading it would "
                         "read freed memory",
                         hint="give a tensor whose storage holds its elements")
    return tensor


def within_storage(tensor: torch.Tensor) -> bool:
    """Whether every element the tensor addresses lies in its storage. A caller can
    shrink a storage under a live tensor (`untyped_storage().resize_`); reading the
    tensor then reads freed memory, which crashes eager PyTorch too."""
    return tensor.numel() == 0 or (tensor.data_ptr() != 0 and
                                   extent_bytes(tensor) <= tensor.untyped_storage().nbytes())


def extent_bytes(tensor: torch.Tensor) -> int:
    """The bytes of its storage a non-empty tensor reaches: up to its last element."""
    last = tensor.storage_offset() + sum((size - 1) * stride
                                         for size, stride in zip(tensor.shape, tensor.stride()))
    return int(last + 1) * tensor.element_size()


def _as_tensor(spec: InputSpec, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise InputError(f"{spec.name} is on {value.device}; the interpreter runs on the CPU")
        # Copying a tensor that requires grad would record it in autograd.
        return value.detach() if value.requires_grad else value
    if isinstance(value, numpy.ndarray):
        if value.dtype.kind not in "biuf":
            raise InputError(f"{spec.name} has dtype {value.dtype}, expected "
                             f"{_dtype_name(spec.dtype)} ({spec.describe()})")
        if not value.dtype.isnative:
            value = value.astype(value.dtype.newbyteorder("="))
        if not (value.flags.writeable and value.flags.aligned) or min(value.strides, default=0) < 0:
            value = numpy.array(value)  # torch shares only aligned, writable, forward memory
        try:
            return torch.from_numpy(value)
        except TypeError as error:
            raise InputError(f"{spec.name}: {error}") from None
    raise InputError(f"{spec.name} must be a tensor or numpy array ({spec.describe()}), got "
                     f"{type(value).__name__}")


def _checked_scalar(spec: InputSpec, value: Any) -> Any:
    if isinstance(value, (numpy.ndarray, numpy.generic, torch.Tensor)) and value.ndim == 0:
        value = value.item()
    if spec.kind == "bool" and isinstance(value, bool):
        return value
    if spec.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if spec.kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise InputError(f"{spec.name} must be a single {spec.kind}, got {type(value).__name__} "
                     f"{value!r:.40}")


def _dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")
