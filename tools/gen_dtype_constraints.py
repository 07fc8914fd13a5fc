"""Generate `exirc/edge/dtype_constraints.yaml`, the dtypes each Edge op admits.

A developer script, run by hand when torch is upgraded or EXTRA_OPS changes;
nothing imports it at compile time:

    pip install expecttest   # torch's OpInfo database (torch.testing._internal) imports it
    python -m tools.gen_dtype_constraints [--out PATH]

Ops: the Edge dialect admits the core ATen op set (the OpOverloads tagged
`torch.Tag.core`), plus EXTRA_OPS below: the ops our pipeline keeps although
they are not core.

The data comes from running torch on CPU, in four steps:

1. Call sites. Every sample input of torch's OpInfo database is run under a
   dispatch mode that records the arguments each Edge op is called with;
   non-core ops are decomposed with torch's core decomposition table on the
   way, so e.g. `batch_norm` samples reach `_native_batch_norm_legit`. The
   `_copy` twin of a view op reuses the view op's call sites, and the ops no
   sample reaches get the hand-written samples of `hand_samples()`. Of the
   call sites of different shapes, the SITES_PER_OP smallest are kept, and
   `forms_samples()` adds forms of a call OpInfo's smallest samples miss.
2. Observation. For each call site, each tensor argument (a tensor list
   counts as one) is cast to each of the ten real dtypes (Bool ... Double; a
   complex argument also keeps its own dtype), `Scalar` arguments to
   bool/int/float and `ScalarType` arguments (`dtype=`) to None and each
   dtype. Every combination that runs is recorded with the dtypes of its
   outputs. With up to FULL_PRODUCT_ARGS tensor arguments every combination
   is tried; with more, those where at most one argument's dtype differs.
   A `dtype=` argument is not a key of the DSL, so e.g. `sum.dim_IntList`
   admits any input with any output.
3. Compression (`compress`). A type_constraint row gives each key a type
   variable (keys sharing an alias have the same dtype, see `dtypes.py`) and
   each variable a dtype set. A greedy cover: take the first combination no
   row holds yet, grow a row through it for each way of sharing variables
   its equal dtypes allow, keep the row holding most new combinations,
   repeat. Rows only ever hold observed combinations, so the YAML admits
   exactly what torch ran.
4. Ops no call site reaches, or for which no combination runs, get a
   permissive rule (every tensor any dtype) and a `permissive: <reason>`
   field, so the file says which of its data was not measured.

The output is deterministic (fixed seeds, fixed order). It takes about a
CPU minute (2-4 minutes of wall time on a busy 2-core machine), most of it
running the OpInfo samples.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from exirc.edge.dtypes import CONSTRAINTS_FILE, DTYPE_NAMES, DTYPES, bind_arguments, is_tensor_type
from exirc.edge.ops import copy_twin, qualified_name

OpOverload = torch._ops.OpOverload

# Non-core ops the Edge dialect admits: the `_copy` twins of the core view
# ops (views become copies on the way to Edge; see exirc/edge/views_to_copies.py) are
# added by `edge_ops()`. Name any other op here as "aten::name.overload".
EXTRA_OPS: tuple[str, ...] = ()

SITES_PER_OP = 6  # call sites measured per op: those with the smallest tensors
MAX_SHAPES = 32  # call sites of different shapes recorded per op
SAMPLES_PER_OPINFO = 8  # OpInfo samples run per OpInfo
FULL_PRODUCT_ARGS = 3  # up to this many tensor arguments, try every dtype combination

# The dtypes every tensor argument is cast to (complex only where a sample has it).
ALL_DTYPES: tuple[torch.dtype, ...] = tuple(d for d in DTYPES.values() if not d.is_complex)
DTYPE_ORDER = {dtype: index for index, dtype in enumerate(DTYPES.values())}

Call = tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs)


# --------------------------------------------------------------------------
# The op set.
# --------------------------------------------------------------------------


def _resolve(name: str) -> OpOverload:
    """"aten::add.Tensor" (or "aten::sigmoid" for the default overload) -> the op."""
    namespace, rest = name.split("::")
    base, _, overload = rest.partition(".")
    op: OpOverload = getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")
    return op


def core_ops() -> list[OpOverload]:
    """Every aten OpOverload tagged `torch.Tag.core`, sorted by name."""
    ops = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, schema.name[len("aten::"):], None)
        op = getattr(packet, schema.overload_name or "default", None)
        if isinstance(op, OpOverload) and torch.Tag.core in op.tags:
            ops[qualified_name(op)] = op
    return [ops[name] for name in sorted(ops)]


def edge_ops() -> list[OpOverload]:
    """The ops the Edge dialect admits: core ops, their view ops' `_copy` twins, EXTRA_OPS."""
    ops = {qualified_name(op): op for op in core_ops()}
    for op in list(ops.values()):
        twin = copy_twin(op) if op.is_view else None
        if twin is not None:
            ops[qualified_name(twin)] = twin
    for name in EXTRA_OPS:
        ops[name] = _resolve(name)
    return [ops[name] for name in sorted(ops)]


# --------------------------------------------------------------------------
# Step 1: call sites.
# --------------------------------------------------------------------------


@dataclass
class CallSites:
    """Calls of each wanted op, one per shape (see `_shape_key`), at most MAX_SHAPES."""

    wanted: frozenset[OpOverload]
    calls: dict[OpOverload, dict[tuple[Any, ...], Call]]

    def add(self, op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        sites = self.calls.setdefault(op, {})
        key = _shape_key(op, args, kwargs)
        if len(sites) < MAX_SHAPES and key not in sites:
            sites[key] = (_detached(args), _detached(kwargs))

    def smallest(self, op: OpOverload) -> list[Call]:
        """The SITES_PER_OP calls of `op` with the fewest tensor elements."""
        calls = list(self.calls.get(op, {}).values())
        return sorted(calls, key=lambda call: _numel(*call))[:SITES_PER_OP]


def _numel(*values: Any) -> int:
    leaves = torch.utils._pytree.tree_leaves(values)
    return sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))


def _detached(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


def _shape_key(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What tells call sites apart: which tensors are there, their ranks, scalar kinds."""
    key: list[tuple[Any, ...]] = []
    for name, value in sorted(bind_arguments(op._schema, args, kwargs).items()):
        if isinstance(value, torch.Tensor):
            key.append((name, "tensor", value.dim()))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            key.append((name, "tensors", len(value)))
        elif isinstance(value, (bool, int, float)):
            key.append((name, type(value).__name__))
        elif value is None or isinstance(value, (str, torch.dtype)):
            key.append((name, str(value)))
    return tuple(key)


class _Recorder(TorchDispatchMode):
    """Records calls of the wanted ops; decomposes other ops to reach more of them."""

    def __init__(self, sites: CallSites, decompositions: dict[Any, Callable[..., Any]]) -> None:
        super().__init__()
        self.sites = sites
        self.decompositions = decompositions

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func in self.sites.wanted:
            self.sites.add(func, tuple(args), dict(kwargs))
        elif func in self.decompositions:
            with _Recorder(self.sites, self.decompositions):
                result = self.decompositions[func](*args, **kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)


def _opinfo_dtype(info: Any) -> torch.dtype | None:
    supported = info.supported_dtypes("cpu")
    for dtype in (torch.float32, torch.int64, torch.bool, *ALL_DTYPES):
        if dtype in supported:
            return dtype
    return None


def record_opinfo_sites(sites: CallSites) -> None:
    """Run the samples of every OpInfo (float32 where supported) under `_Recorder`."""
    from torch._decomp import core_aten_decompositions
    from torch.testing._internal.common_methods_invocations import op_db

    decompositions = dict(core_aten_decompositions())
    infos: list[Any] = sorted(op_db, key=lambda i: (i.name, i.variant_test_name))
    for info in infos:
        dtype = _opinfo_dtype(info)
        if dtype is None:
            continue
        torch.manual_seed(0)
        try:
            samples = list(itertools.islice(
                info.sample_inputs("cpu", dtype, requires_grad=False), SAMPLES_PER_OPINFO))
        except Exception:
            continue  # a sample generator that needs something we lack
        for sample in samples:
            try:
                with _Recorder(sites, decompositions):
                    info.op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                continue  # the sample itself fails; its calls so far are recorded


def hand_samples() -> dict[OpOverload, list[Call]]:
    """Call sites for the Edge ops no OpInfo sample reaches."""
    aten = torch.ops.aten
    torch.manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape)

    ints = torch.tensor([[3, 5, 6], [1, 2, 12]])
    x = randn(2, 3, 4)
    ln_out, ln_mean, ln_rstd = aten.native_layer_norm.default(x, [4], randn(4), randn(4), 1e-5)
    _, gn_mean, gn_rstd = aten.native_group_norm.default(x, randn(4), randn(4), 2, 4, 3, 2, 1e-5)
    del ln_out
    gx = randn(2, 4, 3)
    return {
        aten._adaptive_avg_pool2d_backward.default: [((randn(1, 2, 2, 2), randn(1, 2, 4, 4)), {})],
        aten._embedding_bag.default: [
            ((randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 3])), {}),
        ],
        aten._native_batch_norm_legit.no_stats: [
            ((randn(2, 3, 4), randn(3), randn(3), True, 0.1, 1e-5), {}),
        ],
        aten._native_batch_norm_legit_no_training.default: [
            ((randn(2, 3, 4), randn(3), randn(3), randn(3), randn(3).abs() + 0.5, 0.1, 1e-5), {}),
        ],
        aten.adaptive_avg_pool1d.default: [((randn(1, 3, 8), [4]), {})],
        aten.atan2.out: [((randn(3, 4), randn(3, 4)), {"out": torch.empty(3, 4)})],
        aten.avg_pool1d.default: [((randn(1, 3, 8), [2]), {})],
        aten.avg_pool2d_backward.default: [
            ((randn(1, 2, 2, 2), randn(1, 2, 4, 4), [2, 2], [2, 2], [0, 0], False, True, None),
             {}),
        ],
        aten.bitwise_and.Scalar: [((ints, 3), {}), ((ints > 2, True), {})],
        aten.bitwise_or.Scalar: [((ints, 3), {}), ((ints > 2, True), {})],
        aten.bitwise_xor.Scalar: [((ints, 3), {}), ((ints > 2, True), {})],
        aten.col2im.default: [((randn(1, 8, 9), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]), {})],
        aten.convolution_backward.default: [
            ((randn(1, 2, 3, 3), randn(1, 3, 5, 5), randn(2, 3, 3, 3), [2], [1, 1], [0, 0],
              [1, 1], False, [0, 0], 1, [True, True, True]), {}),
        ],
        aten.copy.default: [((randn(3, 4), randn(3, 4)), {}), ((randn(3, 4), randn(4)), {})],
        aten.div.Scalar_mode: [
            ((randn(3, 4), 2.0), {"rounding_mode": "floor"}),
            ((randn(3, 4), 2), {"rounding_mode": "trunc"}),
        ],
        aten.embedding_dense_backward.default: [
            ((randn(4, 3), torch.tensor([0, 2, 1, 2]), 5, -1, False), {}),
        ],
        aten.fmod.Scalar: [((randn(3, 4), 2.0), {}), ((ints, 4), {})],
        aten.gt.Scalar: [((randn(3, 4), 0.5), {}), ((ints, 4), {})],
        aten.native_dropout.default: [((randn(3, 4), 0.5, True), {})],
        aten.native_group_norm_backward.default: [
            ((gx, gx.clone(), gn_mean, gn_rstd, randn(4), 2, 4, 3, 2, [True, True, True]), {}),
        ],
        aten.native_layer_norm_backward.default: [
            ((randn(2, 3, 4), x, [4], ln_mean, ln_rstd, randn(4), randn(4), [True, True, True]),
             {}),
        ],
        aten.pow.Scalar: [((2.0, randn(3, 4)), {}), ((2, ints), {})],
        aten.randperm.default: [((5,), {})],
        aten.reflection_pad3d.default: [((randn(1, 1, 3, 3, 3), [1, 1, 1, 1, 1, 1]), {})],
        aten.replication_pad3d.default: [((randn(1, 1, 3, 3, 3), [1, 1, 1, 1, 1, 1]), {})],
        aten.scatter.value: [((randn(3, 4), 1, torch.tensor([[0, 1], [2, 3], [1, 0]]), 1.5), {})],
        aten.sym_is_contiguous.default: [((randn(3, 4),), {})],
        aten.sym_numel.default: [((randn(3, 4),), {})],
        aten.sym_size.int: [((randn(3, 4), 0), {})],
        aten.sym_storage_offset.default: [((randn(3, 4),), {})],
        aten.sym_stride.int: [((randn(3, 4), 0), {})],
        aten.upsample_bilinear2d.vec: [((randn(1, 2, 3, 3), [6, 6], False, None), {})],
        aten.upsample_nearest2d.vec: [((randn(1, 2, 3, 3), [6, 6], None), {})],
        aten.var.dim: [((randn(3, 4), [1], True, False), {})],
    }


def forms_samples() -> dict[OpOverload, list[Call]]:
    """Call sites added to every op's own: argument forms the smallest OpInfo
    samples leave out, yet models use."""
    x = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
    return {
        # Boolean-mask indexing, `x[x > 0]`: its output size depends on the data.
        torch.ops.aten.index.Tensor: [((x, [x > 0]), {}), ((x, [x[:, 0] > 0]), {})],
    }


def collect_call_sites(ops: Sequence[OpOverload]) -> dict[OpOverload, list[Call]]:
    """Call sites per op: OpInfo samples, then view twins and hand-written samples."""
    twins = {copy_twin(op): op for op in ops if op.is_view}
    sites = CallSites(frozenset(ops), {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record_opinfo_sites(sites)
    calls = {op: sites.smallest(op) for op in ops}
    hand = hand_samples()
    for op in ops:
        if not calls[op] and op in twins:
            calls[op] = calls.get(twins[op], [])
        if not calls[op]:
            calls[op] = hand.get(op, [])
    for op, extra in forms_samples().items():
        if op in calls:
            calls[op] = calls[op] + extra
    return calls


# --------------------------------------------------------------------------
# Step 2: observation.
# --------------------------------------------------------------------------

Point = tuple[tuple[str, torch.dtype], ...]  # (key, dtype) for each tensor key, in order


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """`value` (a tensor or a list of them) cast to `dtype`, as a fresh copy.

    Floating values cast to an integer dtype become 1..9 so that division,
    remainder and negative powers stay defined (their result dtype does not
    depend on the values).
    """
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point() and not dtype.is_floating_point:
        value = (value.abs() * 10).floor().remainder(9) + 1
    return value.to(dtype=dtype, copy=True)


def _scalar_variants(value: Any) -> list[Any]:
    """A `Scalar` argument as given, and as each of bool, int and float."""
    if isinstance(value, bool):
        return [value, 1, 1.5]
    if isinstance(value, int):
        return [value, True, float(value)]
    if isinstance(value, float) and math.isfinite(value):
        return [value, True, int(value) or (1 if value >= 0 else -1)]
    if isinstance(value, float):
        return [value, True, 2]
    return [value]


def _candidates(value: Any) -> tuple[torch.dtype, ...]:
    """ALL_DTYPES, and a tensor argument's own dtype if it is not one of them (complex)."""
    tensors = value if isinstance(value, (list, tuple)) else [value]
    own = [t.dtype for t in tensors if isinstance(t, torch.Tensor)]
    return ALL_DTYPES + tuple(d for d in own[:1] if d not in ALL_DTYPES)


def _tensor_dtype_combinations(candidates: Sequence[tuple[torch.dtype, ...]]
                               ) -> Iterator[tuple[torch.dtype, ...]]:
    count = len(candidates)
    if count <= FULL_PRODUCT_ARGS:
        yield from itertools.product(*candidates)
        return
    bases = sorted(set(itertools.chain(*candidates)), key=DTYPE_ORDER.__getitem__)
    for base in bases:  # all the same, then one argument different
        yield (base,) * count
        for position in range(count):
            for other in candidates[position]:
                if other != base:
                    yield tuple(other if i == position else base for i in range(count))


def _outputs(schema: torch._C.FunctionSchema, result: Any) -> list[tuple[str, torch.dtype]]:
    results = [result] if len(schema.returns) == 1 else list(result)
    outputs = []
    for index, (ret, value) in enumerate(zip(schema.returns, results)):
        if not is_tensor_type(ret.type):
            continue
        tensors = value if isinstance(value, (list, tuple)) else [value]
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        if tensors:
            outputs.append((f"__ret_{index}", tensors[0].dtype))
    return outputs


def observe(op: OpOverload, call: Call) -> set[Point]:
    """Every dtype combination of one call site that runs, with its output dtypes."""
    schema = op._schema
    args, kwargs = call
    bound = bind_arguments(schema, args, kwargs)
    tensor_keys = []
    scalar_keys = []
    dtype_keys = []
    for argument in schema.arguments:
        value = bound.get(argument.name)
        if is_tensor_type(argument.type):
            tensors = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(t, torch.Tensor) for t in tensors):
                tensor_keys.append(argument.name)
        elif str(argument.type) in ("number", "Optional[number]") and value is not None:
            scalar_keys.append(argument.name)
        elif "ScalarType" in str(argument.real_type):
            dtype_keys.append(argument.name)
    scalar_choices = [dict(zip(scalar_keys, values)) for values in itertools.product(
        *(_scalar_variants(bound[k]) for k in scalar_keys))]
    if len(scalar_choices) > 4:  # several Scalars: as given, then all of one kind
        scalar_choices = [scalar_choices[0]] + [
            {k: _scalar_variants(bound[k])[i] for k in scalar_keys} for i in (1, 2)]
    dtype_choices = [dict(zip(dtype_keys, values)) for values in itertools.product(
        *([None, *ALL_DTYPES] for _ in dtype_keys))]
    points = set()
    candidates = [_candidates(bound[key]) for key in tensor_keys]
    for dtypes in _tensor_dtype_combinations(candidates):
        cast = {key: _cast(bound[key], dtype) for key, dtype in zip(tensor_keys, dtypes)}
        for scalars, dtype_args in itertools.product(scalar_choices, dtype_choices):
            values = {**bound, **cast, **scalars, **dtype_args}
            try:
                result = _call(op, values, len(args))
            except Exception:
                continue
            outputs = _outputs(schema, result)
            if all(dtype in DTYPE_ORDER for _, dtype in outputs):
                points.add(tuple(zip(tensor_keys, dtypes)) + tuple(outputs))
    return points


def _call(op: OpOverload, values: dict[str, Any], positional: int) -> Any:
    """Call `op` with argument values by name, the first `positional` ones positionally."""
    arguments = op._schema.arguments
    args = [values[a.name] for a in arguments[:positional]]
    kwargs = {a.name: values[a.name] for a in arguments[positional:] if a.name in values}
    return op(*args, **kwargs)


# --------------------------------------------------------------------------
# Step 3: compression into the DSL.
# --------------------------------------------------------------------------

MAX_REFINED_KEYS = 5  # with more keys, try only the coarsest and the finest variable patterns


@dataclass(frozen=True)
class Constraint:
    """One type_constraint row: key i has type variable `variables[i]`, which
    ranges over `sets[variables[i]]`. Different variables are independent."""

    keys: tuple[str, ...]
    variables: tuple[int, ...]
    sets: tuple[frozenset[torch.dtype], ...]

    def points(self) -> Iterator[tuple[torch.dtype, ...]]:
        for choice in itertools.product(*(_ordered(s) for s in self.sets)):
            yield tuple(choice[v] for v in self.variables)


def _ordered(dtypes: frozenset[torch.dtype]) -> list[torch.dtype]:
    return sorted(dtypes, key=DTYPE_ORDER.__getitem__)


def _partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every partition of `items` into blocks, in a fixed order."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _partitions(rest):
        yield [[first], *partition]
        for index in range(len(partition)):
            yield [*partition[:index], [first, *partition[index]], *partition[index + 1:]]


def _patterns(point: tuple[torch.dtype, ...]) -> list[tuple[int, ...]]:
    """Variable patterns a row through `point` may have: keys with different
    dtypes never share a variable; keys with equal dtypes may or may not."""
    classes: dict[torch.dtype, list[int]] = {}
    for index, dtype in enumerate(point):
        classes.setdefault(dtype, []).append(index)
    coarsest = list(classes.values())
    if len(point) > MAX_REFINED_KEYS:
        choices = [coarsest, [[i] for i in range(len(point))]]
    else:
        choices = [sum(parts, []) for parts in itertools.product(
            *(list(_partitions(block)) for block in coarsest))]
    patterns = set()
    for blocks in choices:
        variable = {i: v for v, block in enumerate(sorted(blocks, key=min)) for i in block}
        patterns.add(tuple(variable[i] for i in range(len(point))))
    return sorted(patterns, key=lambda p: (max(p, default=0), p))


def _grow(keys: tuple[str, ...], pattern: tuple[int, ...], point: tuple[torch.dtype, ...],
          observed: set[tuple[torch.dtype, ...]]) -> Constraint:
    """The row of `pattern` through `point`, each variable's set grown in turn
    by every dtype that keeps all of the row's combinations observed."""
    count = max(pattern, default=-1) + 1
    sets = [frozenset([point[pattern.index(v)]]) for v in range(count)]
    for variable in range(count):
        for dtype in DTYPE_ORDER:
            if dtype in sets[variable]:
                continue
            trial = sets.copy()
            trial[variable] = frozenset([dtype])  # only the new combinations
            if all(p in observed for p in Constraint(keys, pattern, tuple(trial)).points()):
                sets[variable] = sets[variable] | {dtype}
    return Constraint(keys, pattern, tuple(sets))


def compress(points: set[Point]) -> list[Constraint]:
    """Observed combinations -> type_constraint rows holding exactly those.

    Greedy cover: take the first combination no row holds yet, grow a row
    through it for each variable pattern it allows, keep the row holding most
    of the combinations not yet held (fewest variables on a tie), repeat.
    """
    by_keys: dict[tuple[str, ...], set[tuple[torch.dtype, ...]]] = {}
    for point in points:
        keys = tuple(key for key, _ in point)
        by_keys.setdefault(keys, set()).add(tuple(dtype for _, dtype in point))
    rows = []
    for keys in sorted(by_keys, key=lambda k: (-len(k), k)):
        observed = by_keys[keys]
        uncovered = sorted(observed, key=lambda p: [DTYPE_ORDER[d] for d in p])
        while uncovered:
            seed = uncovered[0]
            best, best_gain = None, -1
            for pattern in _patterns(seed):
                row = _grow(keys, pattern, seed, observed)
                gain = len(set(row.points()).intersection(uncovered))
                if gain > best_gain:
                    best, best_gain = row, gain
            assert best is not None
            held = set(best.points())
            uncovered = [p for p in uncovered if p not in held]
            rows.append(best)
    return rows


# --------------------------------------------------------------------------
# Step 4 and the YAML.
# --------------------------------------------------------------------------


@dataclass
class Entry:
    op: OpOverload
    rows: list[Constraint]
    permissive: str | None = None


def permissive_rows(op: OpOverload) -> list[Constraint]:
    """One row: every tensor argument and output any dtype, independently."""
    keys = [a.name for a in op._schema.arguments if is_tensor_type(a.type)]
    keys += [f"__ret_{i}" for i, r in enumerate(op._schema.returns) if is_tensor_type(r.type)]
    every = frozenset(ALL_DTYPES)
    return [Constraint(tuple(keys), tuple(range(len(keys))), (every,) * len(keys))] if keys \
        else []


def measure(op: OpOverload, calls: Sequence[Call]) -> Entry:
    """The Entry of one op from its call sites (steps 2 to 4)."""
    if not calls:
        return Entry(op, permissive_rows(op), "no OpInfo or hand-written sample reaches it")
    points: set[Point] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in calls:
            torch.manual_seed(0)
            points |= observe(op, call)
    if not points:
        return Entry(op, permissive_rows(op), "no dtype combination of its samples ran on CPU")
    return Entry(op, compress(points))


def _dtype_list(dtypes: frozenset[torch.dtype]) -> str:
    return "[" + ", ".join(DTYPE_NAMES[d] for d in _ordered(dtypes)) + "]"


def _render(entry: Entry) -> list[str]:
    """One op's YAML entry. Aliases are named in order of first use; a row
    whose independent variables range over equal sets gets one alias each."""
    name = qualified_name(entry.op)
    lines = [f"- func: {name.split('::')[1]}", "  namespace: edge", f"  inherits: {name}"]
    if entry.permissive:
        lines.append(f"  permissive: {entry.permissive}")
    aliases: list[tuple[str, frozenset[torch.dtype]]] = []
    rows = []
    for row in entry.rows:
        names: list[str] = []
        for dtypes in row.sets:
            reusable = [a for a, s in aliases if s == dtypes and a not in names]
            if not reusable:
                aliases.append((f"T{len(aliases)}", dtypes))
                reusable = [aliases[-1][0]]
            names.append(reusable[0])
        cells = [f"{key}: {names[v]}" for key, v in zip(row.keys, row.variables)]
        rows.append("  - {" + ", ".join(cells) + "}")
    if aliases:
        lines.append("  type_alias:")
        lines += [f"    {alias}: {_dtype_list(dtypes)}" for alias, dtypes in aliases]
    lines.append("  type_constraint:" + ("" if rows else " []"))
    return lines + rows


def render_yaml(entries: Sequence[Entry]) -> str:
    permissive = sum(1 for e in entries if e.permissive)
    header = [
        "# Edge op dtype constraints, generated by `python -m tools.gen_dtype_constraints`",
        f"# from torch {torch.__version__} on CPU. Do not edit by hand: see that script.",
        f"# {len(entries)} ops, {permissive} with a permissive (unmeasured) rule.",
        "# DSL: in a type_constraint row, keys naming the same alias have the same dtype,",
        "# chosen from the alias's list; __ret_N is the op's N-th output. An entry with",
        "# `permissive: <reason>` was not measured: its rows admit every dtype.",
        "",
    ]
    body = [line for entry in entries for line in _render(entry)]
    return "\n".join(header + body) + "\n"


def generate(ops: Sequence[OpOverload], log: Callable[[str], None]) -> list[Entry]:
    started = time.perf_counter()
    calls = collect_call_sites(ops)
    log(f"call sites: {time.perf_counter() - started:.0f}s, "
        f"{sum(1 for op in ops if calls[op])}/{len(ops)} ops reached")
    entries = []
    for op in ops:
        entry = measure(op, calls[op])
        entries.append(entry)
        if entry.permissive:
            log(f"  {qualified_name(op)}: permissive ({entry.permissive})")
    log(f"observed: {time.perf_counter() - started:.0f}s")
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    default_out = Path(__file__).resolve().parents[1] / "exirc" / "edge" / CONSTRAINTS_FILE
    parser.add_argument("--out", type=Path, default=default_out)
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    entries = generate(edge_ops(), lambda message: print(message, file=sys.stderr))
    text = render_yaml(entries)
    assert len(yaml.safe_load(text)) == len(entries)
    options.out.write_text(text)
    print(f"wrote {options.out}: {len(entries)} ops in {time.perf_counter() - started:.0f}s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
