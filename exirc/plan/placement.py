"""Memory planning: lifetimes -> events -> offsets, and a checker that proves a plan sound.

Every planned tensor gets a byte offset in one arena. Each tensor takes its
size rounded up to `alignment`, at an aligned offset, so no two tensors share
an aligned block. A plan is sound when tensors whose lifetimes overlap never
share bytes; `check_plan` proves it pair by pair.

    greedy_by_size  largest first, each at the lowest aligned offset free of
                    the already placed tensors whose lifetimes overlap its own
    naive           no reuse: tensors side by side in definition order

The lower bound is the peak of live bytes over the graph (a sweep over
alloc/free events): no sound plan has a smaller arena.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch.fx import Node

from exirc.errors import InternalError, UsageError
from exirc.plan.lifetimes import Lifetime

Placement = Callable[[Sequence[Lifetime], int], dict[Node, int]]


@dataclass
class MemoryPlan:
    """Where each planned tensor lives in the arena, and how the arena compares to the best."""

    offsets: dict[Node, int]
    arena_bytes: int
    lower_bound: int
    alignment: int
    algorithm: str


def plan_memory(
    lifetimes: Sequence[Lifetime], *, alignment: int = 16, algorithm: str = "greedy_by_size"
) -> MemoryPlan:
    """Place the tensors of `lifetimes` in one arena with `algorithm`."""
    if alignment < 1:
        raise UsageError(f"memory alignment must be a positive number of bytes, not {alignment}")
    place = ALGORITHMS.get(algorithm)
    if place is None:
        raise UsageError(
            f"unknown memory planning algorithm {algorithm!r}; choose one of "
            + ", ".join(sorted(ALGORITHMS))
        )
    offsets = place(lifetimes, alignment)
    ends = (offsets[lt.node] + round_up(lt.nbytes, alignment) for lt in lifetimes)
    arena = round_up(max(ends, default=0), alignment)
    return MemoryPlan(offsets, arena, peak_live_bytes(lifetimes, alignment), alignment, algorithm)


def round_up(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def peak_live_bytes(lifetimes: Sequence[Lifetime], alignment: int) -> int:
    """The most bytes live at once: a tensor allocates at `start`, frees after `end`."""
    events: list[tuple[int, int]] = []
    for lt in lifetimes:
        size = round_up(lt.nbytes, alignment)
        events += [(lt.start, size), (lt.end + 1, -size)]
    live = peak = 0
    for _, delta in sorted(events):  # at equal positions, frees (negative) sort first
        live += delta
        peak = max(peak, live)
    return peak


def _greedy(lifetimes: Sequence[Lifetime], alignment: int,
            order: Callable[[Lifetime], tuple[int, ...]]) -> dict[Node, int]:
    """Place tensors one by one, in `order`, each at the lowest gap that fits."""
    placed: list[tuple[Lifetime, int, int]] = []  # (tensor, offset, end of its aligned block)
    for lt in sorted(lifetimes, key=order):
        busy = sorted((lo, hi) for other, lo, hi in placed if other.overlaps(lt))
        size = round_up(lt.nbytes, alignment)
        offset = lowest_gap(busy, size)
        placed.append((lt, offset, offset + size))
    return {lt.node: offset for lt, offset, _ in placed}


def greedy_by_size(lifetimes: Sequence[Lifetime], alignment: int) -> dict[Node, int]:
    return _greedy(lifetimes, alignment, lambda lt: (-lt.nbytes, lt.start, lt.end))


# Orders that each win on some graphs: big tensors first; long-lived ones
# first (they fence the arena); program order (what a stack allocator does).
_ORDERS: tuple[Callable[[Lifetime], tuple[int, ...]], ...] = (
    lambda lt: (-lt.nbytes, lt.start, lt.end),
    lambda lt: (-(lt.end - lt.start), -lt.nbytes, lt.start),
    lambda lt: (-lt.nbytes * (lt.end - lt.start + 1), lt.start),
    lambda lt: (lt.start, -lt.nbytes),
)


def shared_buffers(lifetimes: Sequence[Lifetime], alignment: int) -> dict[Node, int]:
    """Group tensors into buffers of disjoint lifetimes, then stack the buffers.

    Biggest tensors first, each joins the buffer that fits it best (the
    smallest big enough, else the biggest, which grows); a buffer is as big as
    its biggest tensor. Wins where offsets fragment (many same-sized tensors).
    """
    buffers: list[tuple[list[Lifetime], list[int]]] = []  # (members, [size])
    home: dict[Node, int] = {}
    for lt in sorted(lifetimes, key=lambda lt: (-lt.nbytes, lt.start)):
        size = round_up(lt.nbytes, alignment)
        free = [i for i, (members, _) in enumerate(buffers)
                if not any(m.overlaps(lt) for m in members)]
        fits = [i for i in free if buffers[i][1][0] >= size]
        if fits:
            chosen = min(fits, key=lambda i: buffers[i][1][0])
        elif free:
            chosen = max(free, key=lambda i: buffers[i][1][0])
            buffers[chosen][1][0] = size
        else:
            chosen = len(buffers)
            buffers.append(([], [size]))
        buffers[chosen][0].append(lt)
        home[lt.node] = chosen
    starts, top = [], 0
    for _, (size,) in buffers:
        starts.append(top)
        top += size
    return {node: starts[index] for node, index in home.items()}


def greedy_best(lifetimes: Sequence[Lifetime], alignment: int) -> dict[Node, int]:
    """The smallest arena of several placements: greedy over a few orders,
    and shared buffers.

    Greedy by size alone misses the peak of live bytes on some graphs
    (a U-Net's skip connections); trying a few costs milliseconds.
    """
    def arena(offsets: dict[Node, int]) -> int:
        return max((offsets[lt.node] + round_up(lt.nbytes, alignment) for lt in lifetimes),
                   default=0)

    candidates = [_greedy(lifetimes, alignment, order) for order in _ORDERS]
    candidates.append(shared_buffers(lifetimes, alignment))
    return min(candidates, key=arena)


def lowest_gap(busy: Sequence[tuple[int, int]], size: int) -> int:
    """The lowest offset where `size` bytes fit among the `busy` byte ranges (sorted)."""
    offset = 0
    for lo, hi in busy:
        if offset + size <= lo:
            break
        offset = max(offset, hi)
    return offset


def naive(lifetimes: Sequence[Lifetime], alignment: int) -> dict[Node, int]:
    offsets: dict[Node, int] = {}
    top = 0
    for lt in sorted(lifetimes, key=lambda lt: lt.start):
        offsets[lt.node] = top
        top += round_up(lt.nbytes, alignment)
    return offsets


ALGORITHMS: dict[str, Placement] = {
    "greedy_by_size": greedy_by_size, "greedy_best": greedy_best,
    "shared_buffers": shared_buffers, "naive": naive}


def check_plan(lifetimes: Sequence[Lifetime], plan: MemoryPlan) -> None:
    """Prove `plan` sound, or raise InternalError naming the fault.

    Every tensor must sit aligned inside the arena, and two tensors whose
    lifetimes overlap must not share a byte.
    """
    for lt in lifetimes:
        _check_placement(lt, plan)
    by_start = sorted(lifetimes, key=lambda lt: lt.start)
    for i, a in enumerate(by_start):
        for b in by_start[i + 1 :]:
            if b.start > a.end:
                break
            if _shares_bytes(a, b, plan):
                raise InternalError(
                    f"unsound memory plan: {_describe(a, plan)} and {_describe(b, plan)} "
                    "are live at the same time and share bytes"
                )


def _check_placement(lt: Lifetime, plan: MemoryPlan) -> None:
    offset = plan.offsets.get(lt.node)
    if offset is None:
        raise InternalError(f"memory plan has no offset for tensor %{lt.node.name}")
    if offset % plan.alignment != 0:
        raise InternalError(
            f"memory plan misaligns {_describe(lt, plan)}: "
            f"offset is not a multiple of {plan.alignment}"
        )
    if offset < 0 or offset + lt.nbytes > plan.arena_bytes:
        raise InternalError(
            f"memory plan puts {_describe(lt, plan)} outside the arena of {plan.arena_bytes} bytes"
        )


def _shares_bytes(a: Lifetime, b: Lifetime, plan: MemoryPlan) -> bool:
    a_lo, b_lo = plan.offsets[a.node], plan.offsets[b.node]
    return max(a_lo, b_lo) < min(a_lo + a.nbytes, b_lo + b.nbytes)


def _describe(lt: Lifetime, plan: MemoryPlan) -> str:
    offset = plan.offsets[lt.node]
    return (
        f"%{lt.node.name} (lifetime [{lt.start}, {lt.end}], bytes [{offset}, {offset + lt.nbytes}))"
    )
