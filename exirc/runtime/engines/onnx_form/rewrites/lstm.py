"""An unrolled LSTM layer in a finished ONNX model as one ONNX `LSTM` node.

torch decomposes `nn.LSTM` into one cell per layer and time step, and the
XNNPACK delegate's ONNX form has ~12 nodes per cell (onnxruntime: ~0.5 us a
node). `fuse_lstms` takes the model `onnx_graph._model` makes (static shapes,
no subgraphs) and rewrites its graph in place: each run of cells

    gates = x_t [+ h_prev @ Wr] [+ constants]   (a tree of Adds)
    i, f, g, o = Split(gates, 4 equal parts, last axis)   (any order)
    c = sigmoid(f) * c_prev + sigmoid(i) * tanh(g);  h = sigmoid(o) * tanh(c)

where step t + 1 reads step t's h (through the MatMul) and c, with the same
Wr and constants, becomes one LSTM node: X = the steps' x_t ([T, B, 4H]), W a
permutation matrix putting the gates in ONNX's order (i, o, f, c; exact: one
1 a row; `onnx_lstm_input` later folds the projection of x_t into it), R and B
from Wr and the constants in that order. A first step whose
h_prev term was folded into a constant (h0 = 0) fits when that constant is
the bias of the next step; c0 is whatever the first step reads. Each value
read elsewhere keeps its name, shape and meaning: the last h and c are the
node's Y_h and Y_c, a Concat (or chain of Concats) of all the h's in order
is a Reshape of Y, in reverse order a Reshape of Y reversed, any other step's
h is a Gather from Y; a step whose c is read elsewhere ends the
run (the next one starts another node from that c).

The pattern is matched strictly: an intermediate value read by anything else,
other activations, another split, constants that differ between steps or per
batch row, or shapes inference cannot tell exactly leave those cells as they
are. onnxruntime's LSTM sums in another order: results move in the last bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy

from exirc.runtime.engines.onnx_form.rewrites.lstm_match import LstmMatcher, Segment
from exirc.runtime.engines.onnx_form.rewrites.recurrent import (
    RecurrentRewriter,
    Shape,
    shapes_if_any,
)

if TYPE_CHECKING:
    from onnx import ModelProto


def fuse_lstms(model: ModelProto) -> int:
    """Rewrite `model`'s graph in place with unrolled LSTM layers as LSTM nodes
    (module docstring); how many layers. Takes and returns a static-shape
    ONNX model without subgraphs; one whose shapes cannot be inferred is left alone."""
    shapes = shapes_if_any(model, {"Split", "Sigmoid", "Tanh"})  # (~2 ms on lstm_tagger)
    if shapes is None:
        return 0
    fuser = _Rewriter(model, shapes)
    segments = fuser.segments()
    return len(segments) if segments and fuser.rewrite(segments) else 0


class _Rewriter(LstmMatcher, RecurrentRewriter):
    """The matcher, and the LSTM node each segment becomes (`onnx_recurrent` does
    the rest of the rewriting)."""

    def emit(self, segment: Segment) -> None:
        first = segment.cells[0]
        width, batch, steps = first.width, first.batch, len(segment.cells)
        order = numpy.concatenate([numpy.arange(k * width, (k + 1) * width)
                                   for k in first.order])
        state = (1, batch, width)
        inputs = [self.sequence(segment, 4 * width),
                  self.add_constant("W", numpy.eye(4 * width, dtype=numpy.float32)[order][None]),
                  self.add_constant("R", numpy.ascontiguousarray(segment.weight.T[order])[None]),
                  self.add_constant("B", numpy.concatenate(
                      [numpy.zeros(4 * width, numpy.float32), segment.bias[order]])[None]),
                  "",
                  "" if segment.initial_h is None else self.reshaped(segment.initial_h, state),
                  self._initial_c(first.c_prev, state)]
        segment.outputs = [self.fresh("Y"), self.fresh("Y_h"), self.fresh("Y_c")]
        self.made.node("LSTM", inputs, segment.outputs, hidden_size=width)
        self.shapes[segment.outputs[0]] = (steps, 1, batch, width)
        self.shapes[segment.outputs[1]] = self.shapes[segment.outputs[2]] = state

    def _initial_c(self, name: str, state: Shape) -> str:
        array = self.constant(name)
        if array is not None and not array.any():
            return ""
        return self.reshaped(name, state)

    def states_read_elsewhere(self, segment: Segment, read: set[str]) -> None:
        """Give each step's h and the last c that something still reads its value."""
        cells = segment.cells
        lstm = next(n for n in self.made.nodes if n.output[0] == segment.outputs[0])
        for slot, name in ((1, cells[-1].h), (2, cells[-1].c)):
            if name in read:
                if self.shapes[segment.outputs[slot]] == cells[-1].shape:
                    lstm.output[slot] = name
                else:
                    self.reshaped(segment.outputs[slot], cells[-1].shape, name)
        for step, cell in enumerate(cells[:-1]):
            if cell.h in read:
                self.gather_step(segment.outputs[0], step, self.shapes[segment.outputs[1]],
                                 cell.shape, cell.h)
