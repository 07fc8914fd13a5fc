"""An unrolled GRU layer in a finished ONNX model as one ONNX `GRU` node.

torch decomposes `nn.GRU` into one cell per layer, direction and time step,
and the XNNPACK delegate's ONNX form has ~14 nodes per cell (onnxruntime:
~0.5 us a node). `fuse_grus` takes the model `onnx_graph._model` makes (static
shapes, no subgraphs) and rewrites its graph in place: each run of cells
`onnx_gru_match` finds (step t + 1 reads step t's h, with the same recurrent
weight and constants) becomes one GRU node with `linear_before_reset=1`,
which is torch's cell: n = tanh(x_n + r * (h @ W_hn + b_hn)). Its inputs:

    X  the steps' x_t (the input projections, [T, B, 3H])
    W  a permutation matrix putting x_t's chunks in ONNX's gate order (z, r, n);
       exact: one 1 a row (`onnx_lstm_input` later folds the projection into it)
    R, B  the recurrent weight and constants in that order (B's input half zero)
    initial_h  what the first step reads, or none when it started from zeros
       (its h @ W term folded into a constant equal to the next step's bias)

Each value read elsewhere keeps its name, shape and meaning: the last h is the
node's Y_h, a Concat (or chain of Concats) of all the h's in order is a Reshape
of Y, in reverse order (a bidirectional layer's backward direction) a Reshape
of Y reversed, any other step's h a Gather from Y. Anything not exactly such a
cell stays as it is. onnxruntime's GRU sums in another order: results move in
the last bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy

from exirc.runtime.engines.onnx_form.rewrites.gru_match import GruMatcher, GruSegment
from exirc.runtime.engines.onnx_form.rewrites.recurrent import RecurrentRewriter, shapes_if_any

if TYPE_CHECKING:
    from onnx import ModelProto


def fuse_grus(model: ModelProto) -> int:
    """Rewrite `model`'s graph in place with unrolled GRU layers as GRU nodes
    (module docstring); how many layers. Takes and returns a static-shape
    ONNX model without subgraphs; one whose shapes cannot be inferred is left alone."""
    shapes = shapes_if_any(model, {"Sub", "Sigmoid", "Tanh"})
    if shapes is None:
        return 0
    rewriter = _GruRewriter(model, shapes)
    segments = rewriter.segments()
    return len(segments) if segments and rewriter.rewrite(segments) else 0


class _GruRewriter(GruMatcher, RecurrentRewriter):
    """The matcher, and the GRU nodes that replace its segments."""

    def emit(self, segment: GruSegment) -> None:
        first = segment.cells[0]
        width, batch, steps = first.width, first.batch, len(segment.cells)
        columns = numpy.concatenate([numpy.arange(k * width, (k + 1) * width)
                                     for k in first.x_order])
        state = (1, batch, width)
        inputs = [self.sequence(segment, 3 * width),
                  self.add_constant("W", numpy.eye(3 * width, dtype=numpy.float32)[columns][None]),
                  self.add_constant("R", segment.weight.astype(numpy.float32)[None]),
                  self.add_constant("B", numpy.concatenate(
                      [numpy.zeros(3 * width, numpy.float32),
                       segment.bias.astype(numpy.float32)])[None])]
        if segment.initial_h is not None:
            inputs += ["", self.reshaped(segment.initial_h, state)]
        segment.outputs = [self.fresh("Y"), self.fresh("Y_h")]
        self.made.node("GRU", inputs, segment.outputs, hidden_size=width, linear_before_reset=1)
        self.shapes[segment.outputs[0]] = (steps, 1, batch, width)
        self.shapes[segment.outputs[1]] = state

    def states_read_elsewhere(self, segment: GruSegment, read: set[str]) -> None:
        """Give each step's h that something still reads its value: the last is Y_h
        (reshaped if its shape differs), the others Gathers from Y."""
        cells = segment.cells
        gru = next(n for n in self.made.nodes if n.output[0] == segment.outputs[0])
        state = self.shapes[segment.outputs[1]]
        last = cells[-1]
        if last.h in read:
            if state == last.shape:
                gru.output[1] = last.h
            else:
                self.reshaped(segment.outputs[1], last.shape, last.h)
        for step, cell in enumerate(cells[:-1]):
            if cell.h in read:
                self.gather_step(segment.outputs[0], step, state, cell.shape, cell.h)
