"""A loaded method: its value table, its prepared instructions, and the run loop.

The value table (`env`) holds one Python object per program value: a torch
tensor over planned, constant or run-time memory; an int, float or bool; a
list. Tensors are created once at load and changed only in place, so the
instructions can hold them directly. Ints, floats and bools that instructions
write at run time (sizes computed by prim ops, loop counters, conditions) are
read from the table when used.

Each instruction is prepared at load into a step, a closure that runs it and
returns the index of the next instruction when it jumps (None otherwise):

    KernelCall      call the bound kernel (`kernels.bind`)
    DelegateCall    call the backend with its handle (`delegates.bind`)
    MoveCall        value move_to = value move_from; a tensor's data is copied
                    into move_to's planned memory (or aliased, if it has none)
    JumpFalseCall   if the Bool value is false, jump to destination_instruction
    FreeCall        nothing: planned memory is never freed while loaded

A run copies the inputs into their planned memory, runs the chains in order,
and copies the outputs out of the arenas so they survive the next run. One
method instance runs one call at a time (its arenas are shared state).

`run(observer=...)` calls `observer(chain, index)` after each instruction
runs, so a debugger (`exirc compile --verify` localizing a mismatch) can read
what it wrote with `value()` before later instructions reuse the memory.
Observed runs take a separate, slower loop; the plain loop is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy
import torch

from exirc.errors import ExircError, FormatError, InputError, UnsupportedOperatorError
from exirc.runtime import arenas as memory
from exirc.runtime import delegates
from exirc.runtime.errors import ExecutionError, StepLimitError
from exirc.runtime.kernels import Kernel, Values, bind, copy_into, operator_key
from exirc.serialize import program as P
from exirc.serialize.symbolic_shapes import InputDims, MethodShapes, check_dims

if TYPE_CHECKING:
    from exirc.runtime.profile import Profile

Step = Callable[[], "int | None"]

Observer = Callable[[int, int], None]
"""`observer(chain, index)`: called after instruction `index` of `chain` has run."""

DEFAULT_MAX_STEPS = 1_000_000
"""Instructions one run may execute: room for loops over thousands of items,
and at most seconds of a loop that never ends."""

_SCALARS = (P.Int, P.Double, P.Bool)
_MAX_PROBLEMS = 4  # input problems named in one message
_DIM_HINTS = {
    "range": "the program was compiled for that range; recompile with a wider "
             "torch.export.Dim(min=..., max=...) to accept this size",
    "static": "that dim was static when the program was exported; give it a "
              "torch.export.Dim in dynamic_shapes and recompile to vary it",
    "relation": "inputs sharing a symbol must have related sizes, as when the program "
                "was exported",
}


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


@dataclass(frozen=True)
class _Site:
    """Where an instruction is, for messages: its chain, index, what it runs, its source."""

    chain: int
    index: int
    label: str
    source: str


class Method:
    """One method of a loaded program, ready to run."""

    def __init__(self, program: P.Program, plan: P.ExecutionPlan, where: str,
                 kernels: Mapping[int, Kernel], backends: Sequence[tuple[Any, Any]],
                 max_steps: int = DEFAULT_MAX_STEPS, shapes: MethodShapes | None = None,
                 shared_arenas: dict[int, memory.Arena] | None = None) -> None:
        self.name = plan.name
        self.shapes = shapes
        self.max_steps = max_steps
        self._arenas = memory.allocate_arenas(plan, shared_arenas)
        # (where in an arena, initial bytes) of each tensor that is program state
        self._initial_state: list[tuple[Any, memoryview]] = []
        env = _value_table(program, plan, self._arenas, where, self._initial_state)
        self.reset_state()
        written = _written_values(plan, kernels)
        self._env = env
        self._values = Values(env, plan.values, written)
        # Run-time scalars start each run from the file's values, so a failed run
        # (a loop counter left mid-way) cannot change the next one.
        self._scalar_starts = [(i, env[i]) for i in sorted(written)]
        self.inputs = [_input_spec(plan, i, value, where, shapes)
                       for i, value in enumerate(plan.inputs)]
        self.output_values = list(plan.outputs)
        self._chains: list[list[Step]] = []
        self._sites: list[list[_Site]] = []
        for c, chain in enumerate(plan.chains):
            steps, sites = [], []
            for i, instr in enumerate(chain.instructions):
                site = _Site(c, i, _label(plan, instr), _source(chain, i))
                at = f"{where}.chains[{c}].instructions[{i}] ({site.label})"
                steps.append(self._prepare(instr, kernels, backends, at))
                sites.append(site)
            self._chains.append(steps)
            self._sites.append(sites)
        self._profiled: tuple[Profile, list[list[Step]]] | None = None

    @property
    def has_state(self) -> bool:
        """Whether the method keeps state (buffers it updates) from run to run."""
        return bool(self._initial_state)

    def reset_state(self) -> None:
        """Put the program state this method holds back to its initial value."""
        for target, initial in self._initial_state:
            target[:] = numpy.frombuffer(initial, dtype=numpy.uint8)

    # -- preparing instructions ------------------------------------------------

    def _prepare(self, instr: P.Instruction, kernels: Mapping[int, Kernel],
                 backends: Sequence[tuple[Any, Any]], where: str) -> Step:
        env = self._env
        if isinstance(instr, P.KernelCall):
            return bind(kernels[instr.op_index], instr.args, self._values, where)
        if isinstance(instr, P.DelegateCall):
            backend, handle = backends[instr.delegate_index]
            return delegates.bind(backend, handle, instr.args, env, self._values.written)
        if isinstance(instr, P.MoveCall):
            return _move(self._values, instr.move_from, instr.move_to, where)
        if isinstance(instr, P.JumpFalseCall):
            return _jump_false(self._values, instr.cond_value_index,
                               instr.destination_instruction, where)
        return _free

    # -- running ---------------------------------------------------------------

    def run(self, inputs: Sequence[Any] | Mapping[str, Any] = (),
            profile: Profile | None = None, observer: Observer | None = None) -> list[Any]:
        """Run the method on `inputs` (tensors, numpy arrays or scalars, in order or
        by name) and return its outputs, which the next run does not overwrite.

        `observer(chain, index)`, if given, is called after every instruction
        that runs, in execution order (see the module docstring)."""
        checked = self._check_inputs(inputs)
        for index, start in self._scalar_starts:
            self._env[index] = start
        try:
            self._feed(checked)
        except Exception as error:  # noqa: BLE001 (a plan whose input memory is unusable)
            raise ExecutionError(f"cannot copy the inputs of method {self.name!r} into its "
                                 f"planned memory: {type(error).__name__}: {error}") from error
        chains = self._chains if profile is None else self._profiled_chains(profile)
        budget = self.max_steps
        for c, steps in enumerate(chains):
            if observer is None:
                budget = self._execute(c, steps, budget)
            else:
                budget = self._execute_observed(c, steps, budget, observer)
        return [_copy_out(self._env[index]) for index in self.output_values]

    def _execute(self, chain: int, steps: list[Step], budget: int) -> int:
        """The interpreter: run one chain's steps, following jumps, within `budget` steps."""
        pc = 0
        end = len(steps)
        try:
            while pc < end:
                jump = steps[pc]()
                pc = pc + 1 if jump is None else jump
                budget -= 1
                if budget < 0:
                    raise self._step_limit(chain, pc)
        except ExircError:
            raise
        except Exception as error:  # noqa: BLE001 (any kernel's failure, named and re-raised)
            raise self._failure(chain, pc, error) from error
        return budget

    def _execute_observed(self, chain: int, steps: list[Step], budget: int,
                          observer: Observer) -> int:
        """`_execute`, calling `observer` after each step. A separate loop, so the
        plain one pays nothing for it; the observer's own errors are not blamed
        on the instruction."""
        pc = 0
        end = len(steps)
        while pc < end:
            at = pc
            try:
                jump = steps[at]()
            except ExircError:
                raise
            except Exception as error:  # noqa: BLE001 (as in _execute)
                raise self._failure(chain, at, error) from error
            pc = at + 1 if jump is None else jump
            budget -= 1
            if budget < 0:
                raise self._step_limit(chain, pc)
            observer(chain, at)
        return budget

    def _failure(self, chain: int, pc: int, error: Exception) -> ExecutionError:
        site = self._sites[chain][pc]
        detail = (str(error).strip().splitlines() or [""])[0]
        source = f" (from {site.source})" if site.source else ""
        return ExecutionError(f"while executing {self._where(site)} ({site.label}) of method "
                              f"{self.name!r}: {type(error).__name__}: {detail}{source}")

    def _step_limit(self, chain: int, pc: int) -> StepLimitError:
        return StepLimitError(
            f"method {self.name!r} did not finish within {self.max_steps} instructions "
            f"(the step limit); it was about to run instruction {pc} of chain {chain}: "
            "a loop that does not end?")

    def _where(self, site: _Site) -> str:
        chain = f"chain {site.chain}, " if len(self._chains) > 1 else ""
        return f"{chain}instruction {site.index}"

    def _profiled_chains(self, profile: Profile) -> list[list[Step]]:
        if self._profiled is None or self._profiled[0] is not profile:
            wrapped = [profile.wrap(steps, [site.label for site in sites])
                       for steps, sites in zip(self._chains, self._sites)]
            self._profiled = (profile, wrapped)
        return self._profiled[1]

    # -- inputs ----------------------------------------------------------------

    def _check_inputs(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        """Each input converted and checked against the signature; nothing is fed yet."""
        specs = self.inputs
        if isinstance(inputs, (list, tuple)):
            pass  # the common case, checked first: ABC isinstance checks are slow
        elif isinstance(inputs, Mapping):
            expected = [spec.name for spec in specs]
            if set(inputs) != set(expected) or len(inputs) != len(expected):
                raise InputError(
                    f"method {self.name!r} takes inputs named {', '.join(expected) or 'nothing'}"
                    f", got {', '.join(map(str, inputs)) or 'nothing'}",
                    hint=f"give one value per input: {self.signature()}")
            inputs = [inputs[name] for name in expected]
        elif isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise InputError(f"inputs must be a sequence or a mapping by name, got "
                             f"{type(inputs).__name__}")
        if len(inputs) != len(specs):
            raise InputError(f"method {self.name!r} takes {len(specs)} input"
                             f"{'' if len(specs) == 1 else 's'}, got {len(inputs)}",
                             hint=f"the method's inputs: {self.signature()}")
        checked = [_checked(spec, value) for spec, value in zip(specs, inputs)]
        if self.shapes is not None:
            self._check_symbols(checked)
        return checked

    def _check_symbols(self, inputs: list[Any]) -> None:
        """Every relation between input dims the program relies on, before it runs:
        each symbol within its range and the same wherever it appears, each derived
        dim equal to its expression, each static dim exact, and every symbolic dim
        within its planned bound (which `_checked` left to this check, so its
        message can name the symbol). All problems are reported together."""
        assert self.shapes is not None
        symbolic = [(spec, value) for spec, value in zip(self.inputs, inputs)
                    if spec.symbol_dims is not None]
        _, problems = check_dims(self.shapes.symbols, [
            InputDims(spec.name, spec.symbol_dims, tuple(value.shape))
            for spec, value in symbolic if spec.symbol_dims is not None])
        if problems:
            shown = [p.message for p in problems[:_MAX_PROBLEMS]]
            if len(problems) > _MAX_PROBLEMS:
                shown.append(f"and {len(problems) - _MAX_PROBLEMS} more")
            raise InputError(f"{'; '.join(shown)} (method {self.name!r}: {self.signature()})",
                             hint=_DIM_HINTS[problems[0].kind])
        for spec, value in symbolic:
            for d, size in enumerate(value.shape):
                if size > spec.shape[d]:  # the planned memory, whatever the file says
                    raise InputError(f"{spec.name} has shape {list(value.shape)}, but dim {d} "
                                     f"may be at most {spec.shape[d]} ({spec.describe()})")

    def _feed(self, inputs: list[Any]) -> None:
        env = self._env
        for spec, value in zip(self.inputs, inputs):
            if spec.kind != "tensor":
                env[spec.value] = value
                continue
            target: torch.Tensor = env[spec.value]
            if not spec.planned:
                memory.alias(target, value.contiguous())  # memory supplied at run time: use it
                continue
            if target.shape != value.shape:
                target.resize_(value.shape)
            target.copy_(value)

    def value(self, index: int) -> Any:
        """The object behind value `index` now: a tensor over planned or file memory,
        a scalar, a list. For debugging and tests; a run may change it in place."""
        return self._env[index]

    def signature(self) -> str:
        """`input_0: f32[2, 8], input_1: int`."""
        return ", ".join(f"{spec.name}: {spec.describe()}" for spec in self.inputs) or "none"


# ---------------------------------------------------------------------------
# Building the value table.
# ---------------------------------------------------------------------------


def _value_table(program: P.Program, plan: P.ExecutionPlan,
                 arenas: list[numpy.typing.NDArray[numpy.uint8]], where: str,
                 initial_state: list[tuple[Any, memoryview]]) -> list[Any]:
    env: list[Any] = []
    for i, value in enumerate(plan.values):
        if isinstance(value, P.Tensor):
            env.append(_tensor(program, value, arenas, f"{where}.values[{i}]", initial_state))
        elif isinstance(value, P.Int):
            env.append(value.int_val)
        elif isinstance(value, P.Double):
            env.append(value.double_val)
        elif isinstance(value, P.Bool):
            env.append(value.bool_val)
        elif isinstance(value, P.String):
            env.append(value.string_val)
        elif isinstance(value, (P.DoubleList, P.BoolList)):
            env.append(list(value.items))
        else:
            env.append(None)  # Null, and the lists of other values filled below
    for i, value in enumerate(plan.values):
        if isinstance(value, (P.IntList, P.TensorList)):
            env[i] = [env[item] for item in value.items]
        elif isinstance(value, P.OptionalTensorList):
            env[i] = [None if item == -1 else env[item] for item in value.items]
    return env


def _tensor(program: P.Program, meta: P.Tensor,
            arenas: list[numpy.typing.NDArray[numpy.uint8]], where: str,
            initial_state: list[tuple[Any, memoryview]]) -> torch.Tensor:
    dtype = memory.torch_dtype(meta.scalar_type, where)
    extra = meta.extra_tensor_info
    if extra is not None and extra.location == P.TensorDataLocation.EXTERNAL:
        raise UnsupportedOperatorError(
            f"{where} keeps its data outside the program (external data "
            f"{extra.fully_qualified_name!r}), which the interpreter cannot load yet")
    info = meta.allocation_info
    if info is None:
        if meta.data_buffer_idx:
            return memory.constant_tensor(program.constant_data(meta.data_buffer_idx), meta, dtype)
        return memory.placeholder(dtype)  # memory arrives at run time (input, view)
    arena = arenas[info.memory_id]
    if meta.data_buffer_idx:  # mutable state with an initial value, set by reset_state
        start = info.offset
        initial_state.append((arena[start:start + meta.nbytes],
                              memory.initial_state(program, meta, where)))
    return memory.planned_tensor(arena, meta, dtype)


def _written_values(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel]) -> frozenset[int]:
    """Values other than tensors that change at run time: they are read when used.

    Inputs, the result slots of kernels, and the targets of moves. (Tensors
    change only in place, so the objects bound at load stay right.)
    """
    written = set(plan.inputs)
    for chain in plan.chains:
        for instr in chain.instructions:
            if isinstance(instr, P.KernelCall):
                written.update(instr.args[len(kernels[instr.op_index].schema.arguments):])
            elif isinstance(instr, P.MoveCall):
                written.add(instr.move_to)
    tensors = (P.Tensor, P.TensorList, P.OptionalTensorList)
    return frozenset(i for i in written if not isinstance(plan.values[i], tensors))


def _input_spec(plan: P.ExecutionPlan, position: int, index: int, where: str,
                shapes: MethodShapes | None) -> InputSpec:
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


# ---------------------------------------------------------------------------
# Inputs: conversion and checks.
# ---------------------------------------------------------------------------


def _checked(spec: InputSpec, value: Any) -> Any:
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
    return tensor


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


# ---------------------------------------------------------------------------
# Steps other than kernel and delegate calls.
# ---------------------------------------------------------------------------


def _move(values: Values, source: int, target: int, where: str) -> Step:
    env = values.env
    kind = values.evalues[target]
    if not isinstance(kind, P.Tensor):
        def move_value() -> None:
            env[target] = env[source]
        return move_value
    if not isinstance(values.evalues[source], P.Tensor):
        raise FormatError(f"{where} moves a {type(values.evalues[source]).__name__} into a "
                          "tensor")
    if kind.data_buffer_idx and kind.allocation_info is None:
        raise FormatError(f"{where} moves into value {target}, a constant tensor")
    src: torch.Tensor = env[source]
    dst: torch.Tensor = env[target]
    if kind.allocation_info is None:
        def share() -> None:
            memory.alias(dst, src)
        return share

    def copy() -> None:
        copy_into(dst, src)
    return copy


def _jump_false(values: Values, condition: int, destination: int, where: str) -> Step:
    env = values.env
    kind = values.evalues[condition]
    if isinstance(kind, P.Tensor):
        tensor: torch.Tensor = env[condition]

        def jump_on_tensor() -> int | None:
            return None if bool(tensor) else destination
        return jump_on_tensor
    if not isinstance(kind, P.Bool):
        raise FormatError(f"{where}: its condition, value {condition}, is a "
                          f"{type(kind).__name__}, not a Bool")

    def jump() -> int | None:
        return None if env[condition] else destination
    return jump


def _free() -> None:
    return None


def _copy_out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_copy_out(item) for item in value]
    return value


def _label(plan: P.ExecutionPlan, instr: P.Instruction) -> str:
    if isinstance(instr, P.KernelCall):
        op = plan.operators[instr.op_index]
        return operator_key(op.name, op.overload)
    if isinstance(instr, P.DelegateCall):
        return f"delegate {plan.delegates[instr.delegate_index].id}"
    names = {P.MoveCall: "move", P.JumpFalseCall: "jump_false", P.FreeCall: "free"}
    return names[type(instr)]


def _source(chain: P.Chain, index: int) -> str:
    """The innermost source frame of instruction `index`, if the program kept one."""
    if index >= len(chain.stacktrace) or not chain.stacktrace[index].items:
        return ""
    frame = chain.stacktrace[index].items[-1]
    text = f"{frame.filename or '?'}:{frame.lineno}"
    if frame.name:
        text += f" in {frame.name}"
    if frame.context:
        text += f": {frame.context.strip()}"
    return text
