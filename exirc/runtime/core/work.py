"""What each instruction costs to run, estimated once, at load, from the plan.

The run loop's budget (`Method.max_steps`) is counted in steps. A step is
what one cheap instruction costs the interpreter (about 2 µs on a laptop
core); an instruction that does more counts as more steps:

    cost = base + units // UNITS_PER_STEP

`base` is the fixed cost of calling the kernel (1 for most; more for
kernels with a heavy set-up, like a convolution), and `units` estimates the
work it does, in element operations of about 2 ns each: the elements of
every tensor it reads and writes, at their planned (upper-bound) sizes,
plus the multiply-adds of a contraction (convolution, matmul, attention,
distances), the windows of a pooling, the log factor of a sort. An
instruction over small tensors costs one step; a convolution over a large
feature map, thousands.

The estimates err on the high side: they exist so that a program that loops
forever (a hostile or corrupted file) is stopped within seconds whatever its
loop body does, and legitimate loops stay far inside the default budget.
Only the plan is read: a tensor's sizes, a pooling's kernel size. A value
written at run time (a size computed by a prim op) is taken at its worst.
"""

from __future__ import annotations

import array
import math
from collections.abc import Mapping, Sequence
from typing import Any

from exirc.runtime.errors import StepLimitError
from exirc.runtime.kernels.registry import Kernel
from exirc.serialize import program as P

UNITS_PER_STEP = 1000
"""Element operations (about 2 ns each) that cost as much as one step."""

# Fixed costs, in steps, of kernels whose set-up dwarfs a cheap instruction's,
# by a substring of the operator name; the first match wins.
_BASE_STEPS: tuple[tuple[str, int], ...] = (
    ("conv", 16), ("norm", 8), ("pool", 8), ("softmax", 4), ("upsample", 8),
    ("grid_sampler", 8), ("index_put", 8), ("_fft_", 8), ("scaled_dot_product", 16),
    ("dist_forward", 4),
)
_DELEGATE_BASE_STEPS = 16

# Operators that multiply matrices: out[..., i, j] sums K products, where K is
# the last size of the left operand (the first of these arguments it has).
_CONTRACTIONS = frozenset({
    "aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear", "aten::mv", "aten::addmv", "aten::_addmm_activation", "aten::_int_mm",
    "aten::_weight_int8pack_mm", "exirc::addmm_relu", "quantized_decomposed::mixed_mm",
    "quantized_decomposed::mixed_linear",
})
_LEFT_OPERANDS = ("mat1", "batch1", "input", "self")
_DISTANCES = frozenset({"aten::_cdist_forward", "aten::_pdist_forward", "aten::cdist",
                        "aten::pdist"})
_SORTS = ("topk", "sort", "kthvalue", "median", "mode", "unique", "_fft_")

# Units per multiply-add (or per window element), against an element
# operation: a blocked matmul or convolution does several per element
# operation's time; distances, pooling windows and convolutions' gradients
# do fewer.
_FAST_MAC_UNITS = 0.25
_SLOW_MAC_UNITS = 2.0


def chain_costs(plan: P.ExecutionPlan, chain: P.Chain, kernels: Mapping[int, Kernel],
                handles: Sequence[Any], written: frozenset[int]) -> list[int]:
    """The cost in steps of each instruction of `chain` (see the module docstring).

    `handles` are the method's delegate handles, in delegate order; `written`
    the values other than tensors that instructions write at run time."""
    return [instruction_cost(plan, instr, kernels, handles, written)
            for instr in chain.instructions]


def prefix_sums(costs: Sequence[int]) -> Sequence[int]:
    """`sums[i]` is the cost of instructions 0 to i - 1, so instructions
    d to j cost `sums[j + 1] - sums[d]`.

    Kept by every loaded method for every instruction, so as 8-byte integers
    (a list would hold a 28-byte int object per sum past 256), unless a sum
    outgrows them (estimates of absurd sizes in a hostile file): then a list.
    Made as integers from the start: a list first would peak at the int objects."""
    sums = array.array("q", [0])
    total = 0
    for cost in costs:
        total += cost
        try:
            sums.append(total)
        except OverflowError:
            return _listed_sums(costs)
    return sums


def _listed_sums(costs: Sequence[int]) -> list[int]:
    sums = [0]
    for cost in costs:
        sums.append(sums[-1] + cost)
    return sums


def instruction_cost(plan: P.ExecutionPlan, instr: P.Instruction, kernels: Mapping[int, Kernel],
                     handles: Sequence[Any], written: frozenset[int] = frozenset()) -> int:
    """One instruction's cost in steps: at least 1."""
    values = plan.values
    if isinstance(instr, P.KernelCall):
        kernel = kernels.get(instr.op_index)
        if kernel is None:  # not resolved: loading refuses the program anyway
            return 1
        base, units = _kernel_work(kernel, instr.args, values, written)
    elif isinstance(instr, P.DelegateCall):
        base, units = _delegate_work(instr, values, handles)
    elif isinstance(instr, P.MoveCall):
        base, units = 1, _elements(values, instr.move_from) + _elements(values, instr.move_to)
    else:
        base, units = 1, 0
    return base + int(units) // UNITS_PER_STEP


# ---------------------------------------------------------------------------
# Kernels.
# ---------------------------------------------------------------------------


def _kernel_work(kernel: Kernel, args: Sequence[int], values: Sequence[P.EValue],
                 written: frozenset[int]) -> tuple[int, float]:
    """(base steps, work units) of one call of `kernel` on `args`."""
    name = kernel.name.rpartition(".")[0] or kernel.name  # "aten::add.out" -> "aten::add"
    schema_args = list(kernel.schema.arguments)
    named = {arg.name: index for arg, index in zip(schema_args, args)}
    outs = [index for arg, index in zip(schema_args, args)
            if arg.alias_info is not None and arg.alias_info.is_write]
    outs += list(args[len(schema_args):])  # a functional op's result slots
    elements = sum(_elements(values, index) for index in args)
    out = sum(_elements(values, index) for index in outs)
    base = next((steps for part, steps in _BASE_STEPS if part in name), 1)
    return base, elements + _extra_work(name, named, values, out, written)


def _extra_work(name: str, named: Mapping[str, int], values: Sequence[P.EValue],
                out: int, written: frozenset[int]) -> float:
    """Work beyond touching each element once, for operators that do more."""
    if name in _CONTRACTIONS:
        return out * _last_size(values, named, _LEFT_OPERANDS) * _FAST_MAC_UNITS
    if name in _DISTANCES:
        return out * _last_size(values, named, ("x1", "self", "input")) * _SLOW_MAC_UNITS
    if "scaled_dot_product" in name:
        query = _elements(values, named.get("query", -1))
        key = _tensor(values, named.get("key", -1))
        keys = key.sizes[-2] if key is not None and len(key.sizes) >= 2 else 1
        return 2 * query * max(keys, 0) * _FAST_MAC_UNITS
    if "conv" in name and "weight" in named:
        return _convolution_work(name, named, values, out)
    if "pool" in name and "kernel_size" in named:
        inputs = _elements(values, named.get("self", named.get("input", -1)))
        window = _int_list_product(values, named["kernel_size"], written, default=inputs)
        return out * min(window, max(inputs, 1)) * _SLOW_MAC_UNITS
    if any(part in name for part in _SORTS):
        largest = max((_elements(values, index) for index in named.values()), default=0)
        return largest * math.log2(largest + 1)
    return 0.0


def _convolution_work(name: str, named: Mapping[str, int], values: Sequence[P.EValue],
                      out: int) -> float:
    """Multiply-adds of a convolution (or a transposed one): each element of the
    larger of input and output meets every weight of one output channel."""
    weight = _tensor(values, named["weight"])
    weights = _elements(values, named["weight"])
    channels = max(weight.sizes[0], 1) if weight is not None and weight.sizes else 1
    per_element = weights // channels
    feature = max(_elements(values, named.get("input", -1)), out,
                  _elements(values, named.get("grad_output", -1)))
    if "backward" in name:  # gradients of input and weight: two convolutions, slower ones
        return 2 * feature * per_element * _SLOW_MAC_UNITS
    return feature * per_element * _FAST_MAC_UNITS


# ---------------------------------------------------------------------------
# Delegates.
# ---------------------------------------------------------------------------


def _delegate_work(instr: P.DelegateCall, values: Sequence[P.EValue],
                   handles: Sequence[Any]) -> tuple[int, float]:
    """A delegate's graph is opaque here: its handle may say what one call costs
    (an int `work`, in units), otherwise its arguments' elements stand in."""
    handle = handles[instr.delegate_index] if 0 <= instr.delegate_index < len(handles) else None
    work = getattr(handle, "work", None)
    if isinstance(work, int) and not isinstance(work, bool) and work >= 0:
        return _DELEGATE_BASE_STEPS, work
    return _DELEGATE_BASE_STEPS, sum(_elements(values, index) for index in instr.args)


# ---------------------------------------------------------------------------
# Sizes from the plan.
# ---------------------------------------------------------------------------


def _tensor(values: Sequence[P.EValue], index: int) -> P.Tensor | None:
    value = values[index] if 0 <= index < len(values) else None
    return value if isinstance(value, P.Tensor) else None


def _numel(tensor: P.Tensor) -> int:
    """Elements at the planned sizes; a negative size (a corrupted file) counts as none."""
    count = 1
    for size in tensor.sizes:
        count *= max(size, 0)
    return count


def _elements(values: Sequence[P.EValue], index: int) -> int:
    """The elements of value `index`: a tensor's, or a tensor list's items'; else 0."""
    value = values[index] if 0 <= index < len(values) else None
    if isinstance(value, P.Tensor):
        return _numel(value)
    if isinstance(value, (P.TensorList, P.OptionalTensorList)):
        return sum(_numel(item) for item in (_tensor(values, i) for i in value.items)
                   if item is not None)
    return 0


def _last_size(values: Sequence[P.EValue], named: Mapping[str, int],
               candidates: Sequence[str]) -> int:
    """The last size of the first of `candidates` that is a tensor argument."""
    for name in candidates:
        tensor = _tensor(values, named.get(name, -1))
        if tensor is not None:
            return max(tensor.sizes[-1], 1) if tensor.sizes else 1
    return 1


def _int_list_product(values: Sequence[P.EValue], index: int, written: frozenset[int],
                      default: int) -> int:
    """The product of an int list's values (a kernel size), or `default` if any
    of them is computed at run time or the value is not an int list."""
    value = values[index] if 0 <= index < len(values) else None
    if not isinstance(value, P.IntList):
        return default
    product = 1
    for item in value.items:
        entry = values[item] if 0 <= item < len(values) else None
        if not isinstance(entry, P.Int) or item in written:
            return default
        product *= max(entry.int_val, 1)
    return product


def step_limit_error(method: str, max_steps: int, chain: int, pc: int) -> StepLimitError:
    """The step limit, reached before instruction `pc` of `chain`."""
    return StepLimitError(
        f"method {method!r} did not finish within {max_steps} instructions "
        f"(the step limit); it was about to run instruction {pc} of chain {chain}: "
        "a loop that does not end?")


def work_limit_error(method: str, max_steps: int, costs: Sequence[int], chain: int,
                     start: int, stop: int) -> StepLimitError:
    """The step limit, reached by a backward jump from `stop` to `start` (`costs`: the
    chain's prefix sums): in instructions if they are all cheap, else in steps,
    saying what a pass costs."""
    span = stop + 1 - start
    cost = costs[stop + 1] - costs[start]
    if cost == span:
        return step_limit_error(method, max_steps, chain, start)
    return StepLimitError(
        f"method {method!r} did not finish within {max_steps} steps (the step "
        f"limit, in which an instruction that a loop repeats counts one step per "
        f"{UNITS_PER_STEP} element operations it does); it was about to run instructions "
        f"{start} to {stop} of chain {chain} again, {span} instructions costing {cost} "
        "steps: a loop that does not end?")
