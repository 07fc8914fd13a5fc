"""Unrolled LSTM cells in a finished ONNX model, and the runs of them that are one
ONNX LSTM node (see `onnx_lstm`, which rewrites the graph).

A cell is matched from the Split of its gates, strictly: each intermediate
value has exactly one reader, the activations are sigmoid, sigmoid, tanh and
sigmoid (in whichever chunks), and every shape is known and fits
(`LstmMatcher._cell`). Its gates are a tree of Adds of one x_t, at most one
MatMul of a [.., H] value by a constant [H, 4H] weight and constants
(`_terms`). Cells chain when one reads the previous one's h (through that
MatMul) and c; a chain is cut into segments where the weight or constants
change or a c is read by anything but the next step (`_segment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING

import numpy

from exirc.runtime.engines.onnx_form.rewrites.recurrent import (
    CellGraph,
    Shape,
    StepShape,
    segments_of_chains,
)

if TYPE_CHECKING:
    from onnx import NodeProto

_ACTIVATIONS = ("Sigmoid", "Tanh")
_MUL_FC, _TANH_C, _BODY = 7, 8, 10  # `Cell.body`: split, 4 activations, i*g, c, f*c, tanh, h


@dataclass
class Cell(StepShape):
    """One matched step. `order`: the gates' chunk index of ONNX's i, o, f, c."""

    gates: str
    h: str
    c: str
    c_prev: str
    order: tuple[int, int, int, int]
    shape: Shape  # of h, c and each gate
    body: list[NodeProto]
    x: str = ""
    h_prev: str | None = None
    recurrent: NodeProto | None = None  # the MatMul h_prev @ weight
    weight: numpy.ndarray | None = None  # [H, 4H]
    rows: numpy.ndarray | None = None  # the constant terms per batch row, [B, 4H]
    previous: Cell | None = None


@dataclass
class Segment:
    """Consecutive cells that are one LSTM node."""

    cells: list[Cell]
    weight: numpy.ndarray
    bias: numpy.ndarray
    initial_h: str | None  # None: zeros
    outputs: list[str] = field(default_factory=lambda: ["", "", ""])  # Y, Y_h, Y_c


class LstmMatcher(CellGraph):
    """The graph's nodes and who makes and reads each value; finds the segments."""

    # -- matching -------------------------------------------------------------------

    def cell(self, split: NodeProto) -> Cell | None:
        """The cell whose gates `split` cuts, or None if it is not exactly one."""
        gates = split.input[0]
        shape = self.shapes.get(gates)
        if len(split.output) != 4 or not shape or shape[-1] % 4 or \
                self.sole_reader(gates) is not split:
            return None
        width = shape[-1] // 4
        axis = next((a.i for a in split.attribute if a.name == "axis"), 0)
        sizes = self.constant(split.input[1]) if len(split.input) > 1 else None
        if axis % len(shape) != len(shape) - 1 or sizes is None or list(sizes) != [width] * 4:
            return None
        cell_shape = (*shape[:-1], width)
        found = [self.sole_reader(out) for out in split.output]
        acts = [a for a in found if a is not None and a.op_type in _ACTIVATIONS
                and self.sole_reader(a.output[0]) is not None]
        if len(acts) != 4:
            return None
        values = [a.output[0] for a in acts]
        kinds = [a.op_type for a in acts]
        if kinds.count("Tanh") != 1:
            return None
        g = kinds.index("Tanh")
        input_gate = self._mul_partner(values[g])
        if input_gate is None or input_gate[1] not in values:
            return None
        mul_ig, i = input_gate[0], values.index(input_gate[1])
        add = self.sole_reader(mul_ig.output[0])
        if add is None or add.op_type != "Add" or len(add.input) != 2:
            return None
        mul_fc = self.producer(add.input[1 - list(add.input).index(mul_ig.output[0])])
        if mul_fc is None or mul_fc.op_type != "Mul" or \
                self.sole_reader(mul_fc.output[0]) is not add:
            return None
        f_names = [name for name in mul_fc.input if name in values]
        if len(f_names) != 1 or len(mul_fc.input) != 2:
            return None
        f = values.index(f_names[0])
        c_prev = mul_fc.input[1 - list(mul_fc.input).index(f_names[0])]
        tanh_c = next((r for r in self.readers(add.output[0]) if r.op_type == "Tanh"), None)
        o = ({0, 1, 2, 3} - {g, i, f} or {-1}).pop()
        if tanh_c is None or len({g, i, f, o}) != 4:
            return None
        output_gate = self._mul_partner(tanh_c.output[0])
        if output_gate is None or output_gate[1] != values[o]:
            return None
        mul_h = output_gate[0]
        body = [split, *acts, mul_ig, add, mul_fc, tanh_c, mul_h]
        if any(self.shapes.get(n.output[0]) != cell_shape for n in body[1:]) or \
                any(self.shapes.get(out) != cell_shape for out in split.output) or \
                prod(self.shapes.get(c_prev, (0,))) != prod(cell_shape):
            return None
        return Cell(gates, mul_h.output[0], add.output[0], c_prev, (i, o, f, g), cell_shape,
                     body)

    def _mul_partner(self, value: str) -> tuple[NodeProto, str] | None:
        """The Mul that alone reads `value` (a value with no other reader), and its
        other operand."""
        mul = self.sole_reader(value)
        if mul is None or mul.op_type != "Mul" or len(mul.input) != 2 or \
                mul.input[0] == mul.input[1]:
            return None
        return mul, mul.input[1 - list(mul.input).index(value)]

    def _terms(self, cell: Cell, cells_by_h: dict[str, Cell]) -> bool:
        """Fill in `cell`'s x_t, recurrent MatMul and constant rows from the Adds
        making its gates; False if they are not exactly that."""
        gate_shape = (*cell.shape[:-1], 4 * cell.width)
        leaves, stack = [], [cell.gates]
        while stack:
            name = stack.pop()
            node = self.producer(name)
            if node is not None and node.op_type == "Add" and len(node.input) == 2 and \
                    (name == cell.gates or self.sole_reader(name) is not None):
                cell.body.append(node)
                stack.extend(node.input)
            else:
                leaves.append(name)
        for name in {*leaves, *(n.output[0] for n in cell.body[_BODY:])}:
            if not _broadcasts_to(self.shapes.get(name), gate_shape):
                return False
        rows = numpy.zeros(gate_shape, dtype=numpy.float32)
        variables = []
        for name in leaves:
            array = self.constant(name)
            if array is None:
                variables.append(name)
            else:
                rows = rows + array
        if any(prod(self.shapes[name]) != prod(gate_shape) for name in variables):
            return False
        matmuls = {name: node for name in variables
                   if (node := self.producer(name)) is not None and
                   self._recurrent(cell, name) is not None}
        linked = [name for name, node in matmuls.items() if node.input[0] in cells_by_h]
        if linked:
            recurrent = linked[0]
        elif len(variables) == 2 and len(matmuls) == 1:
            recurrent = next(iter(matmuls))
        else:
            recurrent = None
        others = [name for name in variables if name != recurrent]
        if len(others) != 1 or len(linked) > 1:
            return False
        cell.x, cell.rows = others[0], rows.reshape(cell.batch, 4 * cell.width)
        if recurrent is not None:
            cell.recurrent = matmuls[recurrent]
            cell.h_prev = cell.recurrent.input[0]
            cell.weight = self._recurrent(cell, recurrent)
            cell.body.append(cell.recurrent)
        return True

    def _recurrent(self, cell: Cell, name: str) -> numpy.ndarray | None:
        """The weight [H, 4H] if `name` is a MatMul of an [..., B, H] value by one
        (and read only by the gates' Adds), else None."""
        node = self.producer(name)
        if node is None or node.op_type != "MatMul" or self.sole_reader(name) is None:
            return None
        weight = self.constant(node.input[1])
        source = self.shapes.get(node.input[0])
        if weight is None or weight.shape != (cell.width, 4 * cell.width) or source is None or \
                source[-1] != cell.width or prod(source) != prod(cell.shape):
            return None
        return weight

    def segments(self) -> list[Segment]:
        """The runs of matched cells that become LSTM nodes."""
        cells = [cell for node in self.nodes if node.op_type == "Split"
                 and (cell := self.cell(node)) is not None]
        cells_by_h = {cell.h: cell for cell in cells}
        cells = [cell for cell in cells if self._terms(cell, cells_by_h)]
        cells_by_h = {cell.h: cell for cell in cells}
        successors: dict[int, list[Cell]] = {}
        for cell in cells:
            previous = cells_by_h.get(cell.h_prev or "")
            if previous is not None and previous.c == cell.c_prev:
                cell.previous = previous
                successors.setdefault(id(previous), []).append(cell)
        return segments_of_chains(cells, successors, self._segment)

    def _segment(self, chain: list[Cell], start: int) -> Segment | None:
        """The longest segment of `chain` from `start` on (None if that cell cannot
        start one)."""
        first = chain[start]
        assert first.rows is not None
        following = chain[start + 1] if start + 1 < len(chain) else None
        weight, bias = first.weight, _shared_row(first.rows)
        if weight is None and following is not None and following.weight is not None and \
                (row := _shared_row(following.rows)) is not None and \
                numpy.array_equal(first.rows, numpy.broadcast_to(row, first.rows.shape)):
            weight, bias = following.weight, row  # h0 = 0 folded into the bias
        if bias is None:
            return None
        if weight is None:  # one step with h0 = 0 and nothing to tell the weight
            weight = numpy.zeros((first.width, 4 * first.width), dtype=numpy.float32)
        cells = [first]
        for cell in chain[start + 1:]:
            last = cells[-1]
            # c may be read by its own tanh and the next step's f * c alone
            if any(r is not last.body[_TANH_C] and r is not cell.body[_MUL_FC]
                   for r in self.readers(last.c)) \
                    or last.c in self.outputs or cell.shape != first.shape or \
                    cell.order != first.order or cell.weight is None or cell.rows is None or \
                    not numpy.array_equal(cell.weight, weight) or \
                    not numpy.array_equal(cell.rows, numpy.broadcast_to(bias, cell.rows.shape)):
                break
            cells.append(cell)
        return Segment(cells, weight, bias, first.h_prev if first.weight is not None else None)


def _broadcasts_to(shape: Shape | None, target: Shape) -> bool:
    try:
        return shape is not None and numpy.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _shared_row(rows: numpy.ndarray | None) -> numpy.ndarray | None:
    """The row every batch row equals, or None."""
    if rows is None or not (rows == rows[:1]).all():
        return None
    return rows[0]
