"""Test cases for a compiled program: inputs, and what eager PyTorch returns for them.

A `ReferenceCase` is made before the compile pipeline runs (passes may
rewrite captured graphs in place, and a plugin pass may even touch shared
weights), from the model's example inputs or from `.npz` files given by the
user (`exirc compile --verify-inputs`). An `.npz` holds one case: keys
`input_0`, `input_1`, ... for `forward` (or the only method), and
`METHOD.input_0`, ... for another method; a method without keys in the file
keeps its example inputs.

The eager reference is the model itself (its `forward`, or a method's
module); for a `.pt2` archive it is the archive's own graph, run by torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from exirc.errors import ModelError, UsageError
from exirc.ir.source import display_path

if TYPE_CHECKING:
    from exirc.capture import MethodSource


@dataclass
class ReferenceCase:
    """One set of inputs for one method, and eager PyTorch's outputs for them."""

    method: str
    number: int  # among the method's cases
    args: tuple[Any, ...]  # as the eager model takes them
    inputs: list[torch.Tensor]  # as the program takes them: the tensors of `args`, flattened
    expected: list[Any]  # eager outputs, flattened
    origin: str = "example inputs"  # or the .npz file they came from
    # For a method with program state: which of the consecutive calls on these
    # inputs this is. Call 0 starts from the initial state; call k follows call k-1.
    call: int = 0
    calls: int = 1

    @property
    def label(self) -> str:
        label = f"{self.method} case {self.number}"
        return label if self.calls == 1 else f"{label} call {self.call + 1} of {self.calls}"


@dataclass
class Reference:
    """What to compare a method against: its eager model, and its cases."""

    source: MethodSource
    eager: Any  # callable: the module, or a .pt2 archive's graph
    cases: list[ReferenceCase] = field(default_factory=list)


# How many times in a row a method with program state is called per case: a
# lost update shows from the second call on, one applied twice from the third.
STATEFUL_CALLS = 3


def prepare(sources: dict[str, MethodSource], input_files: Sequence[str | Path] = (),
            calls: Mapping[str, int] | None = None,
            what: str = "verification inputs") -> dict[str, Reference]:
    """The eager reference of every method with one case per input file (or the
    example inputs), eager outputs computed now.

    `calls[method]` (default 1) makes each case that many consecutive calls
    from the model's initial state: one ReferenceCase per call."""
    references = {name: Reference(source, _eager_callable(source))
                  for name, source in sources.items()}
    default = "forward" if "forward" in sources or len(sources) != 1 else next(iter(sources))
    per_method: dict[str, list[tuple[tuple[Any, ...], str]]] = {name: [] for name in sources}
    for file in input_files:
        arrays = _load_npz(file, what)
        claimed = _split_keys(arrays, sources, default, file)
        for name, source in sources.items():
            if name in claimed:
                args = _replace_tensors(source, claimed[name], name, file)
                per_method[name].append((args, display_path(str(file))))
    for name, reference in references.items():
        runs = per_method[name] or [(reference.source.example_inputs, "example inputs")]
        count = (calls or {}).get(name, 1)
        for number, (args, origin) in enumerate(runs):
            inputs = [leaf for leaf in tree_leaves(args) if isinstance(leaf, torch.Tensor)]
            for call, expected in enumerate(run_eager(reference, args, count)):
                reference.cases.append(ReferenceCase(name, number, args, inputs, expected,
                                                     origin, call, count))
    return references


def run_eager(reference: Reference, args: tuple[Any, ...], calls: int = 1) -> list[list[Any]]:
    """The eager outputs of `calls` consecutive calls, each flattened; the model's
    buffers are left as they were before the first."""
    module = reference.eager
    try:
        with torch.no_grad(), _buffers_restored(module):
            results = [module(*[_copy(a) for a in args]) for _ in range(calls)]
    except Exception as error:
        where = reference.source.path or reference.source.origin
        raise ModelError(f"{display_path(where)}: running method {reference.source.name!r} "
                         f"eagerly for verification failed: {type(error).__name__}: "
                         f"{(str(error).splitlines() or [''])[0]}") from error
    return [[_detached(leaf) for leaf in tree_leaves(result)] for result in results]


# ---------------------------------------------------------------------------


def _eager_callable(source: MethodSource) -> Any:
    if source.module is not None:
        return source.module
    if source.exported is not None:
        # A .pt2 archive: its graph is the reference. Made now, before any pass
        # can rewrite the program in place.
        return source.exported.module()
    raise UsageError(f"method {source.name!r} of {source.origin} has no model to verify "
                     "against")


@contextlib.contextmanager
def _buffers_restored(module: Any) -> Iterator[None]:
    """A forward that updates buffers (a running mean, a counter) must not change
    the model that later cases and the compiled program are compared with."""
    buffers = list(module.named_buffers()) if isinstance(module, torch.nn.Module) else []
    saved = [(buffer, buffer.detach().clone()) for _, buffer in buffers]
    try:
        yield
    finally:
        for buffer, value in saved:
            buffer.data.copy_(value)


def _copy(value: Any) -> Any:
    # The model may write into its inputs; the program must see the originals.
    return value.clone() if isinstance(value, torch.Tensor) else value


def _detached(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _load_npz(file: str | Path, what: str) -> dict[str, Any]:
    from exirc.serialize.npy import load_arrays

    shown = display_path(str(file))
    if not str(file).endswith(".npz"):
        raise UsageError(f"{shown}: {what} are a .npz file",
                         hint="numpy.savez('in.npz', input_0=x, input_1=y)")
    return load_arrays(str(file))


def _split_keys(arrays: dict[str, Any], sources: dict[str, MethodSource], default: str,
                file: str | Path) -> dict[str, list[Any]]:
    """`input_N` keys for the default method, `METHOD.input_N` for the others."""
    claimed: dict[str, dict[int, Any]] = {}
    for key, array in arrays.items():
        method, _, name = key.rpartition(".")
        method = method or default
        number = name.removeprefix("input_")
        if method not in sources or not name.startswith("input_") or not number.isdigit():
            raise UsageError(
                f"{display_path(str(file))}: unexpected key {key!r}",
                hint=f"keys are input_0, input_1, ... for {default!r} and METHOD.input_0, ... "
                     f"for another method (methods: {', '.join(sources)})")
        claimed.setdefault(method, {})[int(number)] = array
    result = {}
    for method, numbered in claimed.items():
        if sorted(numbered) != list(range(len(numbered))):
            raise UsageError(f"{display_path(str(file))}: the inputs of method {method!r} are "
                             f"numbered {sorted(numbered)}, expected 0..{len(numbered) - 1}")
        result[method] = [numbered[i] for i in range(len(numbered))]
    return result


def _replace_tensors(source: MethodSource, arrays: list[Any], method: str,
                     file: str | Path) -> tuple[Any, ...]:
    """The example inputs' structure, with its tensors replaced by `arrays` in order."""
    leaves, spec = tree_flatten(source.example_inputs)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    shown = display_path(str(file))
    if len(arrays) != len(positions):
        raise UsageError(f"{shown}: {len(arrays)} inputs for method {method!r}, which takes "
                         f"{len(positions)} tensors")
    for n, (position, array) in enumerate(zip(positions, arrays)):
        example = leaves[position]
        tensor = torch.from_numpy(array)
        if tensor.dtype != example.dtype or tensor.ndim != example.ndim:
            raise UsageError(
                f"{shown}: input_{n} of method {method!r} is {_describe(tensor)}, but the "
                f"example input is {_describe(example)}",
                hint="give arrays of the example inputs' dtypes and ranks")
        leaves[position] = tensor
    return tuple(tree_unflatten(leaves, spec))


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
