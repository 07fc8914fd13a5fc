"""Peephole fusions for the ONNX form: XNNPACK node runs that are one ONNX operator.

XNNPACK has no layer norm; exirc lowers one (and a group norm's statistics) to
about ten nodes, which onnxruntime runs one at a time, its ReduceMean being
slow on small tensors. `plan_fusions` finds, in the clamp-fused node list,

    a = STATIC_RESHAPE(x, [N, H, W, 1])       (the input, seen as NHWC, C = 1)
    b = GLOBAL_AVG_POOLING_2D(a)              (keep dims: the mean over H, W)
    c = SUBTRACT(a, b)
    d = SQUARE(c)
    e = GLOBAL_AVG_POOLING_2D(d)              (keep dims: the variance)
    f = ADD(e, eps)                           (eps: one constant, finite, >= 0)
    g = RECIPROCAL_SQUARE_ROOT(f)
    h = MULTIPLY(c, g)
    i = MULTIPLY(h, weight)                   (optional; weight a constant [H, W, 1])
    j = ADD(i, bias)                          (optional; bias a constant [H, W, 1])

(ADD and MULTIPLY with their operands in either order) and emits it as one
ONNX LayerNormalization of `a` over axes 1..3, followed by the last node's
fused clamp if it has one. The nodes a..h read exactly the definition of
LayerNormalization: with C = 1, the mean and variance over H and W are the
statistics over every normalised element, the variance is the biased one
(the mean of squared deviations), and the result is (a - mean) / sqrt(var +
eps) * scale + bias, computed in float32 (stash_type=1); absent affine nodes
become a scale of ones and a bias of zeros, which change nothing.

A run is declined (and its nodes are emitted one by one as before) when any
value between `a` and the last node is read by another node or is a
delegate output; when a node other than the last has a fused clamp or
flags other than the pattern's; when a value is not plain float32; when
`a` is not a reshape to a static [N, H, W, 1]; or when eps is computed at
run time, is not one number, or is negative or not finite. A weight or bias
that is computed, or does not broadcast onto exactly the normalised dims
(e.g. one varying along N), ends the run before it: the norm is fused, the
affine nodes are emitted on their own. The reshapes around the run are kept
(dropping them would need the shape of the reshape's input, which the
graph does not state reliably).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy

from exirc.runtime.delegates.xnnpack.fuse import reads
from exirc.runtime.delegates.xnnpack.pooling import FLAG_KEEP_DIMS
from exirc.runtime.engines.onnx_form.builder import OnnxBuilder, clamp_bounds, value_name
from exirc.serialize.xnnpack import graph as G

Kind = G.NodeKind
Positioned = list[tuple[int, G.Node]]  # (index in the blob, node), as fuse_clamps gives


@dataclass(frozen=True)
class LayerNorm:
    """One matched layer norm: `source` normalised over its trailing `shape`."""

    source: int  # value id of `a`
    target: int  # value id the last matched node writes
    shape: tuple[int, int, int]  # the normalised dims, (H, W, 1)
    epsilon: float
    scale: numpy.ndarray | None
    bias: numpy.ndarray | None
    last: G.Node  # its fused clamp is applied to the result

    def emit(self, b: OnnxBuilder) -> None:
        """Append the LayerNormalization (and the last node's clamp)."""
        scale = numpy.ones(self.shape, numpy.float32) if self.scale is None \
            else self.scale.reshape(self.shape)
        bias = numpy.zeros(self.shape, numpy.float32) if self.bias is None \
            else self.bias.reshape(self.shape)
        bounds = clamp_bounds(self.last)
        target = value_name(self.target)
        result = b.node("LayerNormalization",
                       [b.read(self.source), b.array("ln_scale", scale),
                        b.array("ln_bias", bias)],
                       None if bounds else [target],
                       axis=1, epsilon=self.epsilon, stash_type=1)
        if bounds:
            b.clamp(result, bounds, target)


@dataclass
class FusionPlan:
    """Which positions of the node list the fusions cover, and where each is emitted."""

    covered: set[int] = dataclasses.field(default_factory=set)
    at: dict[int, LayerNorm] = dataclasses.field(default_factory=dict)

    def emit(self, b: OnnxBuilder, position: int) -> bool:
        """Emit the fusion ending at `position`, if any; whether the node there is
        taken care of (so is not to be emitted on its own)."""
        fusion = self.at.get(position)
        if fusion is not None:
            fusion.emit(b)
        return position in self.covered


def _output(node: G.Node) -> int | None:
    return getattr(node.params, "output_id", None)


class _Matcher:
    """The node list indexed by value: who writes each value, who reads it."""

    def __init__(self, b: OnnxBuilder, nodes: Positioned, outputs: list[int]) -> None:
        self.b = b
        self.nodes = [node for _, node in nodes]
        self.outputs = set(outputs)
        self.writer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = defaultdict(list)
        for position, node in enumerate(self.nodes):
            for value_id in reads(node):
                self.readers[value_id].append(position)
            output = _output(node)
            if output is not None:
                self.writer[output] = position

    def fp32(self, value_id: int) -> bool:
        return self.b.plain_float32(value_id)

    def sole_reader(self, value_id: int, kind: Kind) -> int | None:
        """The one node reading `value_id` (an internal float32 value), if of `kind`,
        without flags or a clamp."""
        readers = self.readers.get(value_id, [])
        if len(readers) != 1 or value_id in self.outputs or not self.fp32(value_id):
            return None
        node = self.nodes[readers[0]]
        return readers[0] if node.kind == kind and self.plain(node) else None

    def plain(self, node: G.Node) -> bool:
        flags = FLAG_KEEP_DIMS if node.kind == Kind.GLOBAL_AVG_POOLING_2D else 0
        return getattr(node.params, "flags", 0) == flags and clamp_bounds(node) is None

    def other_operand(self, position: int, value_id: int) -> int | None:
        """The operand of binary node `position` that is not `value_id`."""
        p = self.nodes[position].params
        if not isinstance(p, G.Node2x1):
            return None
        if p.input1_id == value_id:
            return p.input2_id
        return p.input1_id if p.input2_id == value_id else None

    def constant(self, value_id: int) -> numpy.ndarray | None:
        if not self.fp32(value_id):
            return None
        return self.b.constant(value_id)

    def written(self, position: int) -> int:
        output = _output(self.nodes[position])
        assert output is not None
        return output


def _view_shape(m: _Matcher, value_id: int) -> tuple[int, int, int, int] | None:
    """[N, H, W, 1] when `value_id` is written by a reshape to that static shape."""
    position = m.writer.get(value_id)
    if position is None or not m.fp32(value_id):
        return None
    node = m.nodes[position]
    if node.kind != Kind.STATIC_RESHAPE or not isinstance(node.params, G.StaticReshape):
        return None
    shape = list(node.params.new_shape)
    if len(shape) != 4 or shape[3] != 1 or min(shape[1:]) < 1:
        return None
    return shape[0], shape[1], shape[2], 1


def _epsilon(m: _Matcher, value_id: int | None) -> float | None:
    array = None if value_id is None else m.constant(value_id)
    if array is None or array.size != 1 or array.ndim > 4:
        return None
    number = float(array.reshape(()))
    return number if math.isfinite(number) and number >= 0 else None


def _affine(m: _Matcher, value_id: int | None, shape: tuple[int, int, int]
            ) -> numpy.ndarray | None:
    """A weight or bias that broadcasts onto [N, H, W, 1] along H and W only."""
    array = None if value_id is None else m.constant(value_id)
    if array is None or array.ndim > 4:
        return None
    padded = (1,) * (4 - array.ndim) + tuple(array.shape)
    return array if padded == (1, *shape) else None


def _match(m: _Matcher, mean_at: int) -> tuple[LayerNorm, list[int]] | None:
    """The layer norm whose mean is node `mean_at`, and the positions it covers."""
    mean = m.nodes[mean_at]
    if mean.kind != Kind.GLOBAL_AVG_POOLING_2D or not m.plain(mean):
        return None
    assert isinstance(mean.params, G.Node1x1)
    a, b = mean.params.input_id, mean.params.output_id
    view = _view_shape(m, a)
    if view is None:
        return None
    shape = view[1], view[2], view[3]
    sub = m.sole_reader(b, Kind.SUBTRACT)
    if sub is None or m.nodes[sub].params != G.Node2x1(a, b, m.written(sub), 0):
        return None
    c = m.written(sub)
    readers = m.readers.get(c, [])
    if len(readers) != 2 or c in m.outputs or not m.fp32(c):
        return None
    square = next((r for r in readers if m.nodes[r].kind == Kind.SQUARE), None)
    scaled = next((r for r in readers if m.nodes[r].kind == Kind.MULTIPLY), None)
    if square is None or scaled is None or not m.plain(m.nodes[square]):
        return None
    variance = m.sole_reader(m.written(square), Kind.GLOBAL_AVG_POOLING_2D)
    if variance is None:
        return None
    shifted = m.sole_reader(m.written(variance), Kind.ADD)
    if shifted is None:
        return None
    epsilon = _epsilon(m, m.other_operand(shifted, m.written(variance)))
    rsqrt = m.sole_reader(m.written(shifted), Kind.RECIPROCAL_SQUARE_ROOT)
    if epsilon is None or rsqrt is None:
        return None
    g = m.written(rsqrt)
    if m.readers.get(g) != [scaled] or g in m.outputs or not m.fp32(g) \
            or m.other_operand(scaled, g) != c:
        return None
    if getattr(m.nodes[scaled].params, "flags", 0) != 0:
        return None
    covered = [mean_at, sub, square, variance, shifted, rsqrt, scaled]
    weight, bias, last = None, None, scaled
    for kind in (Kind.MULTIPLY, Kind.ADD):
        if clamp_bounds(m.nodes[last]) is not None:
            break  # a clamp between normalising and the affine part: stop before it
        after = _affine_reader(m, m.written(last), kind)
        found = None if after is None else _affine(
            m, m.other_operand(after, m.written(last)), shape)
        if after is None or found is None or not m.fp32(m.written(after)):
            continue
        weight, bias = (found, bias) if kind == Kind.MULTIPLY else (weight, found)
        covered.append(after)
        last = after
    fusion = LayerNorm(a, m.written(last), shape, epsilon, weight, bias, m.nodes[last])
    return fusion, covered


def _affine_reader(m: _Matcher, value_id: int, kind: Kind) -> int | None:
    """The one node of `kind` reading internal `value_id`; unlike `sole_reader` it may
    have a fused clamp (it is then the last node fused)."""
    readers = m.readers.get(value_id, [])
    if len(readers) != 1 or value_id in m.outputs or not m.fp32(value_id):
        return None
    node = m.nodes[readers[0]]
    if node.kind != kind or getattr(node.params, "flags", 0) != 0:
        return None
    return readers[0]


def plan_fusions(b: OnnxBuilder, nodes: Positioned, outputs: list[int]) -> FusionPlan:
    """The layer norms in `nodes` (the clamp-fused, checked node list of a graph whose
    external outputs are `outputs`), each to be emitted at its last node's position."""
    m = _Matcher(b, nodes, outputs)
    plan = FusionPlan()
    for position, node in enumerate(m.nodes):
        if node.kind != Kind.GLOBAL_AVG_POOLING_2D or position in plan.covered:
            continue
        found = _match(m, position)
        if found is None or plan.covered.intersection(found[1]):
            continue
        fusion, covered = found
        plan.covered.update(covered)
        plan.at[max(covered)] = fusion
    return plan
