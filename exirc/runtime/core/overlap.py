"""Where each tensor's memory may be, and outs that overlap what a kernel reads.

Every planned tensor gets its own torch storage over the shared arena
(`arenas.planned_tensor`), so torch's own overlap checks never see two
tensors that share bytes. A kernel whose out shares bytes with an input it
reads then reads what it has already written: wrong results at best, and for
an index it reads (`index_select`, `gather`, `embedding`) indices it wrote
itself, out of bounds. So, at load, every written tensor of every KernelCall
must share no byte with any other tensor the call names.

Where a tensor's memory is (a `Region`):
  * a planned tensor: its bytes of its buffer (`Bytes`);
  * a constant: the file's bytes (`Constant`; binding refuses writing one
    directly, this module writing one through a view);
  * a method input with no planned memory: what the caller passes (`Supplied`);
  * a tensor given memory at run time, by an instruction: a view an op returns
    (`et_view`, or any functional op whose schema result aliases an argument),
    a MoveCall into a tensor with no memory of its own, or a new tensor a
    functional op returns (`Fresh`). Views and moves take their source's
    regions, followed through the instructions (a dataflow over all chains,
    ignoring order, so loops and branches are covered): a view may be anywhere
    in its base, so it counts as overlapping all of it.

What is allowed to share memory (exact aliasing) is `aliasing.py`'s to say.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from exirc.errors import FormatError
from exirc.runtime.core.kernel_arguments import CallArguments, TensorArgument
from exirc.runtime.kernels.registry import Kernel
from exirc.serialize import program as P


@dataclass(frozen=True)
class Bytes:
    """Bytes [start, end) of planned buffer `buffer`."""

    buffer: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"bytes {self.start}..{self.end} of buffer {self.buffer}"


@dataclass(frozen=True)
class Constant:
    """The file's bytes of constant value `value`."""

    value: int

    def __str__(self) -> str:
        return f"constant value {self.value}"


@dataclass(frozen=True)
class Supplied:
    """The memory of what the caller passes for method input `value`."""

    value: int

    def __str__(self) -> str:
        return f"the memory passed in for input value {self.value}"


@dataclass(frozen=True)
class Fresh:
    """A new tensor a functional op returns into slot `value`, each time it runs."""

    value: int

    def __str__(self) -> str:
        return f"the new tensor the kernel returns into value {self.value}"


Region = Bytes | Constant | Supplied | Fresh

# A view's possible regions are the union of its sources'; past this many, a
# (hostile) file's chains of views cost more to follow than they are worth,
# and the tensor counts as anywhere.
MAX_REGIONS = 64


@dataclass(frozen=True)
class Anywhere:
    """Memory the checks could not follow: overlaps everything."""

    def __str__(self) -> str:
        return f"memory of more than {MAX_REGIONS} possible places"


def overlap(a: Region | Anywhere, b: Region | Anywhere) -> bool:
    if isinstance(a, Anywhere) or isinstance(b, Anywhere):
        return True
    if isinstance(a, Bytes) and isinstance(b, Bytes):
        return a.buffer == b.buffer and a.start < b.end and b.start < a.end
    return a == b


Places = frozenset[Region | Anywhere]

AliasRule = Callable[[Kernel, TensorArgument, TensorArgument], bool]
"""`may_alias(kernel, written, other)`: whether the two arguments may be one tensor."""


Described = Iterable[tuple[tuple[int, int], CallArguments]]
"""((chain, instruction), its description) of KernelCalls, in instruction order."""


class Locations:
    """The regions each tensor value of a method may occupy when a kernel runs.

    A tensor's own region is worked out when asked for; only the tensors that
    views and moves give more places are kept (a set per tensor value, kept,
    would cost several times what the file spends on the tensor)."""

    def __init__(self, plan: P.ExecutionPlan, calls: Described) -> None:
        self._evalues = plan.values
        self._inputs = frozenset(plan.inputs)
        self._places: dict[int, Places] = {}
        self._follow(_sources(plan, calls))

    def of(self, value: int) -> Places:
        places = self._places.get(value)
        if places is not None:
            return places
        tensor = self._evalues[value] if 0 <= value < len(self._evalues) else None
        if not isinstance(tensor, P.Tensor):
            return frozenset()
        own = _own_region(value, tensor, value in self._inputs)
        return frozenset([own] if own is not None else [])

    def _follow(self, sources: dict[int, list[int | Fresh]]) -> None:
        """Give each tensor the regions of everything it may be made to share
        (a worklist over the view and move edges, to a fixed point)."""
        readers: dict[int, list[int]] = {}
        for target, froms in sources.items():
            for source in froms:
                if isinstance(source, int):
                    readers.setdefault(source, []).append(target)
        pending = list(sources)
        while pending:
            target = pending.pop()
            places = set(self.of(target))
            for source in sources[target]:
                places |= {source} if isinstance(source, Fresh) else self.of(source)
            if len(places) > MAX_REGIONS:
                places = {Anywhere()}
            if places != self.of(target):
                self._places[target] = frozenset(places)
                pending.extend(readers.get(target, ()))


def _own_region(index: int, tensor: P.Tensor, is_input: bool) -> Region | None:
    """The memory the file gives the tensor itself, if any."""
    info = tensor.allocation_info
    if tensor.nbytes == 0:
        return None  # no bytes: nothing to overlap
    if info is not None:
        return Bytes(info.memory_id, info.offset, info.offset + tensor.nbytes)
    if tensor.data_buffer_idx:
        return Constant(index)
    if is_input:
        return Supplied(index)
    return None  # given memory by an instruction, if any (see _sources)


def _sources(plan: P.ExecutionPlan, calls: Described) -> dict[int, list[int | Fresh]]:
    """What each tensor may be made to share at run time: the values it may
    become a view of, or `Fresh` for the new tensors a functional op returns.
    `calls` are taken one at a time, in step with the instructions."""
    sources: dict[int, list[int | Fresh]] = {}
    evalues = plan.values
    described = iter(calls)
    pending = next(described, None)
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            if isinstance(instr, P.MoveCall):
                target = evalues[instr.move_to]
                if (isinstance(target, P.Tensor) and target.allocation_info is None
                        and isinstance(evalues[instr.move_from], P.Tensor)):
                    sources.setdefault(instr.move_to, []).append(instr.move_from)
            elif pending is not None and pending[0] == (c, i):
                call = pending[1]
                pending = next(described, None)
                if call.functional:
                    for slot, source in _result_sources(call, evalues):
                        sources.setdefault(slot, []).extend(source)
    return sources


def _result_sources(call: CallArguments, evalues: Sequence[P.EValue]
                    ) -> list[tuple[int, list[int | Fresh]]]:
    """For each tensor result slot of a functional op, what it comes to share:
    the arguments its schema result aliases (`Tensor(a)`), or its own new tensor
    when it has no planned memory to be copied into (`binding._slot_writer`)."""
    pairs = call.result_pairs(evalues)
    found: list[tuple[int, list[int | Fresh]]] = []
    for ret, slot in pairs or ():
        tensor = evalues[slot]
        if not isinstance(tensor, P.Tensor):
            continue
        if ret.alias_info is not None:
            found.append((slot, _aliased(call, ret.alias_info.before_set)))
        elif tensor.allocation_info is None:
            found.append((slot, [Fresh(slot)]))
    return found


def _aliased(call: CallArguments, alias_set: set[str]) -> list[int | Fresh]:
    """The tensors of the arguments in `alias_set`; all of them when no argument
    names the set (a schema we cannot read so closely: assume the worst)."""
    schema_args = {arg.name: arg for arg in call.kernel.schema.arguments}
    matching = [t for t in call.tensors if _alias_set(schema_args[t.name]) & alias_set]
    return [item for t in (matching or call.tensors) for _, item in t.tensors()]


def _alias_set(arg: object) -> set[str]:
    info = getattr(arg, "alias_info", None)
    return set(info.before_set) if info is not None else set()


# ---------------------------------------------------------------------------
# The check.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Use:
    """One tensor a call names: which argument, where in it, which value."""

    argument: TensorArgument
    position: int
    value: int


def check_call(call: CallArguments, locations: Locations, evalues: Sequence[P.EValue],
               may_alias: AliasRule, where: str) -> None:
    """Refuse the call if a tensor it writes may share bytes with another it names.

    `may_alias(kernel, written, other)` says whether the two arguments may be
    the very same tensor (same bytes, same layout), which is safe for some ops
    (see `aliasing`). Partial overlap never is.
    """
    uses = [_Use(t, position, item) for t in call.tensors for position, item in t.tensors()]
    for w, write in enumerate(uses):
        if not write.argument.written:
            continue
        for u, use in enumerate(uses):
            if u == w or (use.argument.written and u < w):
                continue  # itself, or a pair of writes already compared
            place = _shared_place(locations.of(write.value), locations.of(use.value))
            if place is None:
                continue
            if (_identical(write.value, use.value, locations, evalues)
                    and use.argument is not write.argument
                    and may_alias(call.kernel, write.argument, use.argument)):
                continue
            raise FormatError(_message(write, use, place, evalues), field=where)
    for write in uses:
        for region in locations.of(write.value) if write.argument.written else ():
            if isinstance(region, Constant) and region.value != write.value:
                raise FormatError(f"{write.argument.label(write.position)} (value "
                                  f"{write.value}) may be a view of {region}, which it "
                                  "would write into", field=where)


def _shared_place(a: Places, b: Places) -> tuple[Region | Anywhere, Region | Anywhere] | None:
    for x in a:
        for y in b:
            if overlap(x, y):
                return x, y
    return None


def _identical(a: int, b: int, locations: Locations, evalues: Sequence[P.EValue]) -> bool:
    """Whether values a and b are the same tensor when the kernel runs: the same
    value, or two that stay at the same planned bytes (neither is ever made a
    view of something else) with the same element type, fixed sizes and layout."""
    if a == b:
        return True
    x, y = evalues[a], evalues[b]
    assert isinstance(x, P.Tensor) and isinstance(y, P.Tensor)
    here = _own_region(a, x, False)
    if here is None or locations.of(a) != {here} or locations.of(b) != {here}:
        return False  # elsewhere, or a view that may be anywhere in its base
    return (x.scalar_type == y.scalar_type and x.sizes == y.sizes
            and _dim_order(x) == _dim_order(y)
            and x.shape_dynamism == y.shape_dynamism == P.TensorShapeDynamism.STATIC)


def _dim_order(tensor: P.Tensor) -> list[int]:
    return tensor.dim_order or list(range(len(tensor.sizes)))


def _message(write: _Use, other: _Use, place: tuple[Region | Anywhere, Region | Anywhere],
             evalues: Sequence[P.EValue]) -> str:
    how = "writes too" if other.argument.written else "reads"
    return (f"{write.argument.label(write.position)} ({_describe(write.value, place[0], evalues)})"
            f" overlaps {other.argument.label(other.position)} "
            f"({_describe(other.value, place[1], evalues)}), which it {how}")


def _describe(value: int, place: Region | Anywhere, evalues: Sequence[P.EValue]) -> str:
    tensor = evalues[value]
    own = isinstance(tensor, P.Tensor) and _own_region(value, tensor, False) == place
    if own or (isinstance(place, (Supplied, Fresh)) and place.value == value):
        return f"value {value}, {place}"
    return f"value {value}, a view of {place}"
