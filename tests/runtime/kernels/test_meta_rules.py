"""The meta rules answer only where they give what torch's meta kernel gives.

`meta_rules` lets the load-time meta check skip torch's (Python) meta kernel
for common float ops. It must never accept a call the meta kernel would
refuse, nor one after which the meta kernel would leave the out with other
sizes or another dtype: that would weaken the check. Nor may a result it
knows (for the XNNPACK shape check) differ from the meta kernel's in sizes,
dtype or strides. Here every rule meets the meta kernel itself on hundreds
of argument sets (shapes that broadcast and that do not, empty and size-1
dims, dim orders, dtypes, scalars of every kind); torch proposes most outs,
so that the rules have calls to accept.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from exirc.runtime.core.meta_shapes import kernel_outcome
from exirc.runtime.kernels.meta_rules import (
    _IN_PLACE_RULES,
    _OUT_RULES,
    _RESULT_RULES,
    KnownResults,
    accepts,
    known_result,
)
from exirc.runtime.tensor_layout import strides

DTYPES = [torch.float32] * 6 + [torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                torch.int32, torch.bool]
SCALARS: list[Any] = [1, 2, 0, -1, 2.5, -0.0, float("inf"), True, False, 1 + 2j, None]
CASES_PER_OP = 300


def aten_op(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def base_name(name: str) -> str:
    """`mm` for aten::mm.out and aten::mm."""
    return name.removeprefix("aten::").partition(".")[0]


def meta_tensor(rng: random.Random, sizes: list[int], dtype: torch.dtype) -> torch.Tensor:
    order = list(range(len(sizes)))
    if rng.random() < 0.3:
        rng.shuffle(order)
    return torch.empty_strided(sizes, strides(sizes, order), dtype=dtype, device="meta")


def related_sizes(rng: random.Random, base: list[int]) -> list[int]:
    """Sizes near `base`: leading dims dropped, some set to 1, now and then one changed."""
    sizes = base[rng.randint(0, len(base)) if rng.random() < 0.3 else 0:]
    sizes = [1 if rng.random() < 0.2 else size for size in sizes]
    if sizes and rng.random() < 0.15:
        sizes[rng.randrange(len(sizes))] = rng.choice([0, 1, 2, 3, 5])
    return sizes


def tensor_sizes(rng: random.Random, name: str, base: list[int]) -> list[list[int]]:
    """Sizes for each tensor argument, shaped for the op most of the time."""
    n, k, m, b = (rng.choice([0, 1, 2, 3]) for _ in range(4))
    # The second matrix's inner and batch sizes: the first's, most of the time.
    k2, b2 = (size if rng.random() < 0.8 else rng.choice([0, 1, 2, 3]) for size in (k, b))
    if rng.random() < 0.8:
        if base_name(name) == "mm":
            return [[n, k], [k2, m]]
        if base_name(name) == "bmm":
            return [[b, n, k], [b2, k2, m]]
        if base_name(name) == "addmm":
            return [related_sizes(rng, [n, m]), [n, k], [k2, m]]
    return [base] + [related_sizes(rng, base) for _ in range(3)]


def list_argument(rng: random.Random, name: str, self: torch.Tensor) -> list[int]:
    """Dims for permute_copy, sizes for view_copy: valid most of the time."""
    if "permute" in name:
        dims = list(range(self.dim()))
        rng.shuffle(dims)
        dims = [d - self.dim() if rng.random() < 0.3 else d for d in dims]
        if rng.random() < 0.15:
            dims = dims[:-1] if rng.random() < 0.5 else dims + [0]
        return dims
    sizes = list(self.shape)
    if rng.random() < 0.7:
        sizes = [self.numel()] if rng.random() < 0.5 else sizes[::-1]
    if rng.random() < 0.2:
        sizes.append(rng.choice([-1, 1, 2]))
    return sizes


def arguments_for(rng: random.Random, name: str, schema_arguments: list[Any]) -> list[Any]:
    """Values for `schema_arguments`, the first tensor's dtype shared by most."""
    dtype = rng.choice(DTYPES)
    base = [rng.choice([0, 1, 2, 3, 4]) for _ in range(rng.randint(0, 4))]
    sizes = iter(tensor_sizes(rng, name, base))
    found: list[Any] = []
    for arg in schema_arguments:
        kind = str(arg.real_type)
        if kind == "Tensor":
            own = dtype if rng.random() < 0.9 else rng.choice(DTYPES)
            found.append(meta_tensor(rng, next(sizes), own))
        elif kind in ("Scalar", "number"):
            found.append(rng.choice(SCALARS[:-1]))
        elif kind == "Optional[number]":
            found.append(rng.choice(SCALARS))
        elif kind == "int":
            found.append(rng.choice([-3, -2, -1, 0, 1, 2, 3, True]))
        elif kind == "bool":
            found.append(rng.random() < 0.2)
        elif kind in ("List[int]", "List[SymInt]"):
            found.append(list_argument(rng, name, found[0]))
        elif kind == "Optional[MemoryFormat]":
            found.append(None if rng.random() < 0.8 else torch.contiguous_format)
        else:
            raise AssertionError(f"no generator for {kind} ({name})")
    return found


def proposed_out(rng: random.Random, op: torch._ops.OpOverload, arguments: list[Any]
                 ) -> torch.Tensor:
    """An out of the sizes torch makes (it resizes an empty one) most of the
    time, of the first tensor's dtype most of the time, else of other sizes or
    dtype. Where torch refuses or cannot tell, the sizes a rule would be
    likeliest to take: a list argument (view_copy's) or else self's."""
    first = next(a for a in arguments if isinstance(a, torch.Tensor))
    dtype = first.dtype if rng.random() < 0.9 else rng.choice(DTYPES)
    empty = torch.empty(0, dtype=dtype, device="meta")
    made = kernel_outcome(op, op._schema, False, [*arguments, empty])
    sizes = next((list(a) for a in arguments if isinstance(a, list) and min(a, default=0) >= 0),
                 list(first.shape))
    if isinstance(made, list) and made[0] is not None:
        sizes = list(made[0][0])
    if rng.random() < 0.15:
        sizes = related_sizes(rng, sizes)
    return meta_tensor(rng, sizes, dtype)


@pytest.mark.parametrize("name", sorted(_OUT_RULES))
def test_a_rule_accepts_only_what_the_meta_kernel_accepts_as_declared(name: str) -> None:
    rng = random.Random(name)
    op = aten_op(name)
    accepted = 0
    for _ in range(CASES_PER_OP):
        arguments = arguments_for(rng, name, op._schema.arguments[:-1])
        arguments.append(proposed_out(rng, op, arguments))
        if not accepts(name, arguments):
            continue
        accepted += 1
        out = arguments[-1]
        declared = [(tuple(out.shape), out.dtype)]
        # What the load-time check would find without the rule: it must be the
        # declared out, or nothing (a meta kernel that cannot tell refuses nothing).
        outcome = kernel_outcome(op, op._schema, False, arguments)
        assert outcome in (declared, None), f"{arguments}: the meta kernel says {outcome}"
    # Not vacuous: the generated calls include many the rule must take.
    assert accepted >= CASES_PER_OP // 10, f"{name}: {accepted} accepted"


@pytest.mark.parametrize("name", sorted(_OUT_RULES))
def test_every_rule_is_for_an_aten_out_op_whose_last_argument_is_its_out(name: str) -> None:
    schema = aten_op(name)._schema
    out = schema.arguments[-1]
    assert out.name == "out" and out.is_out and str(out.real_type) == "Tensor"
    assert sum(arg.is_out for arg in schema.arguments) == 1


def test_no_rule_for_an_op_without_one_or_a_call_without_an_out() -> None:
    x = torch.empty(2, 3, device="meta")
    assert not accepts("aten::where.self_out", [x, x, x, x])
    assert not accepts("aten::relu.out", [])
    assert not accepts("aten::relu.out", [x, None])


def as_called(rng: random.Random, op: torch._ops.OpOverload, arguments: list[Any]
              ) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) as a caller might pass `arguments`: keyword-only ones by
    name, or left to their defaults now and then."""
    args, kwargs = [], {}
    for arg, value in zip(op._schema.arguments, arguments):
        if not arg.kwarg_only:
            args.append(value)
        elif rng.random() < 0.8:
            kwargs[arg.name] = value
    return args, kwargs


@pytest.mark.parametrize("name", sorted({**_RESULT_RULES, **_IN_PLACE_RULES}))
def test_a_known_result_is_the_one_the_meta_kernel_returns(name: str) -> None:
    rng = random.Random(name)
    op = aten_op(name)
    in_place = name in _IN_PLACE_RULES
    known_count = 0
    for _ in range(CASES_PER_OP):
        args, kwargs = as_called(rng, op, arguments_for(rng, name, op._schema.arguments))
        known = known_result(op, args, kwargs)
        if known is None:
            continue
        known_count += 1
        self_layout = (args[0].shape, args[0].stride())
        made = op(*args, **kwargs)
        assert (made.shape, made.dtype, made.stride()) == \
            (known.shape, known.dtype, known.stride()), f"{args} {kwargs}"
        if in_place:
            assert known is args[0] and made is args[0]
            assert (args[0].shape, args[0].stride()) == self_layout
    assert known_count >= CASES_PER_OP // 10, f"{name}: {known_count} known"


def test_within_known_results_a_linear_layer_is_shaped_as_without() -> None:
    """What the XNNPACK shape check runs for a fully connected node: the same
    sizes, dtype and strides whether the rules answer or the meta kernels do."""
    x, weight, bias = (torch.empty(sizes, device="meta") for sizes in ([2, 16], [32, 16], [32]))
    expected = torch.nn.functional.linear(x, weight, bias).clamp_(0.0, 6.0)
    with KnownResults():
        found = torch.nn.functional.linear(x, weight, bias).clamp_(0.0, 6.0)
    assert (found.shape, found.dtype, found.stride()) == \
        (expected.shape, expected.dtype, expected.stride())


def test_within_known_results_a_refusal_is_still_torchs() -> None:
    x, weight = torch.empty(2, 16, device="meta"), torch.empty(32, 8, device="meta")
    with pytest.raises(RuntimeError) as without:
        torch.nn.functional.linear(x, weight)
    with pytest.raises(RuntimeError) as within, KnownResults():
        torch.nn.functional.linear(x, weight)
    assert str(within.value) == str(without.value)
    assert "must have same reduction dim" in str(within.value)
