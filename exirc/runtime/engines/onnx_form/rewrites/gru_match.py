"""Unrolled GRU cells in a finished ONNX model, and the runs of them that are one
ONNX GRU node (see `onnx_gru`, which rewrites the graph).

torch's GRU cell, as the XNNPACK delegate's ONNX form has it:

    gi_r, gi_z, gi_n = Split(x_t)          gh_r, gh_z, gh_n = Split(gh)
    r = sigmoid(gh_r + gi_r);  z = sigmoid(gh_z + gi_z)
    n = tanh(gi_n + gh_n * r);  h = (h_prev - n) * z + n

with gh = h_prev @ Wr [+ a constant], or, for a first step from h0 = 0, a
constant (its three parts maybe constant Slices of one). A cell is matched
from the Tanh making n, strictly (`GruMatcher.cell`): Adds and Muls in either
operand order, each Split cuts 3 equal parts along its last axis, every
intermediate value is read only inside the cell (n by its Sub and the last
Add), every shape is known and fits, and the reset gate multiplies the
recurrent part with its bias (torch's `linear_before_reset`). Which part of
each Split is which gate is read from the structure, not assumed. Cells chain
when one reads the previous one's h (in its Sub and its MatMul); a chain is
cut into segments where the weight, the constants or the layout change.
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
    axis_of,
    segments_of_chains,
)

if TYPE_CHECKING:
    from onnx import NodeProto


@dataclass
class GruCell(StepShape):
    """One matched step. Gates are in ONNX's order (z, r, n): `x_order` gives
    the chunk of x_t holding each; `weight` ([3H, H], ONNX's R) and `rows`
    ([B, 3H], the constant part of the recurrent gates per batch row) are already
    in that order."""

    h: str
    h_prev: str
    x: str
    x_order: tuple[int, ...]
    shape: Shape  # of h and each gate
    body: list[NodeProto]
    weight: numpy.ndarray | None  # None: no h_prev @ Wr term (h0 = 0 folded)
    rows: numpy.ndarray
    previous: GruCell | None = None


@dataclass
class GruSegment:
    """Consecutive cells that are one GRU node."""

    cells: list[GruCell]
    weight: numpy.ndarray  # R [3H, H]
    bias: numpy.ndarray  # Rb [3H]
    initial_h: str | None  # None: zeros
    outputs: list[str] = field(default_factory=lambda: ["", ""])  # Y, Y_h


class GruMatcher(CellGraph):
    """Finds the cells and the segments of them."""

    def segments(self) -> list[GruSegment]:
        """The runs of matched cells that become GRU nodes."""
        cells = [cell for node in self.nodes if node.op_type == "Tanh"
                 and (cell := self.cell(node)) is not None]
        cells_by_h = {cell.h: cell for cell in cells}
        successors: dict[int, list[GruCell]] = {}
        for cell in cells:
            previous = cells_by_h.get(cell.h_prev)
            if previous is not None and cell.weight is not None:
                cell.previous = previous
                successors.setdefault(id(previous), []).append(cell)
        return segments_of_chains(cells, successors, self._segment)

    def _segment(self, chain: list[GruCell], start: int) -> GruSegment | None:
        """The longest segment of `chain` from `start` on (None if that cell cannot
        start one)."""
        first = chain[start]
        following = chain[start + 1] if start + 1 < len(chain) else None
        weight, bias = first.weight, _shared_row(first.rows)
        if weight is None and following is not None and following.weight is not None and \
                (row := _shared_row(following.rows)) is not None and \
                numpy.array_equal(first.rows, numpy.broadcast_to(row, first.rows.shape)):
            weight, bias = following.weight, row  # h0 = 0: the first step's gh is the bias
        if bias is None:
            return None
        if weight is None:  # one step from h0 = 0: nothing tells the weight, none is needed
            weight = numpy.zeros((3 * first.width, first.width), dtype=numpy.float32)
        cells = [first]
        for cell in chain[start + 1:]:
            if cell.shape != first.shape or cell.x_order != first.x_order or \
                    cell.weight is None or not numpy.array_equal(cell.weight, weight) or \
                    not numpy.array_equal(cell.rows, numpy.broadcast_to(bias, cell.rows.shape)):
                break
            cells.append(cell)
        return GruSegment(cells, weight, bias, first.h_prev if first.weight is not None else None)

    # -- one cell -------------------------------------------------------------------

    def cell(self, tanh: NodeProto) -> GruCell | None:
        """The cell whose candidate state n `tanh` makes, or None if it is not exactly one."""
        n = tanh.output[0]
        shape = self.shapes.get(n)
        pre = self._single_reader_producer(tanh.input[0], "Add", tanh)
        if not shape or pre is None:
            return None
        reset_mul = self._operand_made_by(pre, "Mul")
        if reset_mul is None:
            return None
        x_n = _other(pre, reset_mul.output[0])
        r_sigmoid = self._operand_made_by(reset_mul, "Sigmoid")
        if r_sigmoid is None or x_n is None:
            return None
        gh_n = _other(reset_mul, r_sigmoid.output[0])
        out = self._output_of(n)
        if out is None or gh_n is None:
            return None
        sub, z_mul, h_add = out
        z_sigmoid = self._operand_made_by(z_mul, "Sigmoid")
        r_add = self._single_reader_producer(r_sigmoid.input[0], "Add", r_sigmoid)
        z_add = None if z_sigmoid is None else \
            self._single_reader_producer(z_sigmoid.input[0], "Add", z_sigmoid)
        x_split, gh_split = self.producer(x_n), self.producer(gh_n)
        if z_sigmoid is None or r_add is None or z_add is None or x_split is None or \
                gh_split is None or x_split is gh_split or \
                self.sole_reader(r_sigmoid.output[0]) is not reset_mul or \
                self.sole_reader(z_sigmoid.output[0]) is not z_mul:
            return None
        body = [tanh, pre, reset_mul, r_sigmoid, r_add, z_sigmoid, z_add, sub, z_mul, h_add]
        if any(self.shapes.get(node.output[0]) != shape for node in body):
            return None
        x_order = self._chunk_order(x_split, (z_add, r_add), x_n, shape)
        if x_order is None:
            return None
        body.append(x_split)
        recurrent = self._recurrent(gh_split, (z_add, r_add), gh_n, shape, sub.input[0])
        if recurrent is None:
            return None
        weight, rows, nodes = recurrent
        return GruCell(h_add.output[0], sub.input[0], x_split.input[0], x_order, shape,
                       body + nodes, weight, rows)

    def _single_reader_producer(self, name: str, op_type: str, reader: NodeProto
                                ) -> NodeProto | None:
        """The `op_type` node making `name` (two inputs, one for an activation), if
        `reader` alone reads it."""
        node = self.producer(name)
        arity = 1 if op_type in ("Sigmoid", "Tanh") else 2
        if node is None or node.op_type != op_type or len(node.input) != arity or \
                self.sole_reader(name) is not reader:
            return None
        return node

    def _operand_made_by(self, node: NodeProto, op_type: str) -> NodeProto | None:
        """The one operand of `node` that an `op_type` node makes and only `node` reads."""
        found = [made for name in node.input
                 if (made := self._single_reader_producer(name, op_type, node)) is not None]
        return found[0] if len(found) == 1 and node.input[0] != node.input[1] else None

    def _output_of(self, n: str) -> tuple[NodeProto, NodeProto, NodeProto] | None:
        """(Sub(h_prev, n), Mul(that, z), Add(that, n)): h = (h_prev - n) * z + n."""
        readers = self.readers(n)
        subs = [r for r in readers if r.op_type == "Sub" and len(r.input) == 2 and
                r.input[1] == n and r.input[0] != n]
        if len(readers) != 2 or len(subs) != 1 or n in self.outputs:
            return None
        sub = subs[0]
        z_mul = self._single_reader_producer_of(sub.output[0], "Mul")
        if z_mul is None:
            return None
        h_add = self._single_reader_producer_of(z_mul.output[0], "Add")
        if h_add is None or set(h_add.input) != {z_mul.output[0], n} or \
                not any(reader is h_add for reader in readers):
            return None
        return sub, z_mul, h_add

    def _single_reader_producer_of(self, name: str, op_type: str) -> NodeProto | None:
        """The `op_type` node with two inputs that alone reads `name`."""
        reader = self.sole_reader(name)
        if reader is None or reader.op_type != op_type or len(reader.input) != 2 or \
                reader.input[0] == reader.input[1]:
            return None
        return reader

    def _chunk_order(self, split: NodeProto, gates: tuple[NodeProto, NodeProto], n_part: str,
                     shape: Shape) -> tuple[int, ...] | None:
        """The chunk of `split` (3 equal parts of the last axis, each read once, by
        `gates`' Adds or as n's part) that holds z, r and n, in that order."""
        source = self.shapes.get(split.input[0])
        sizes = self.constant(split.input[1]) if len(split.input) == 2 else None
        width = shape[-1]
        if split.op_type != "Split" or len(split.output) != 3 or source is None or \
                sizes is None or list(sizes) != [width] * 3 or \
                axis_of(split) % len(source) != len(source) - 1 or \
                prod(source) != 3 * prod(shape) or (self.constant(split.input[0]) is None and
                                                   self.sole_reader(split.input[0]) is not split):
            return None
        parts = list(split.output)
        order = []
        for gate in gates:
            mine = [name for name in gate.input if name in parts]
            if len(mine) != 1 or gate.input[0] == gate.input[1]:
                return None
            order.append(parts.index(mine[0]))
        order.append(parts.index(n_part))
        for name in parts:
            part_shape = self.shapes.get(name)
            if part_shape is None or part_shape[-1] != width or prod(part_shape) != prod(shape):
                return None
        return tuple(order) if sorted(order) == [0, 1, 2] else None

    def _recurrent(self, gh_split: NodeProto, gates: tuple[NodeProto, NodeProto], gh_n: str,
                   shape: Shape, h_prev: str
                   ) -> tuple[numpy.ndarray | None, numpy.ndarray, list[NodeProto]] | None:
        """(R in ONNX's order or None, the constant rows [B, 3H] in ONNX's order,
        the nodes making gh) for the recurrent gates gh; None unless gh is
        h_prev @ Wr [+ constant], or constant parts with h_prev all zeros."""
        width, batch = shape[-1], prod(shape) // shape[-1]
        if gh_split.op_type != "Split":
            return self._constant_parts(gates, gh_n, shape, h_prev)
        order = self._chunk_order(gh_split, gates, gh_n, shape)
        gh = gh_split.input[0]
        if order is None:
            return None
        columns = numpy.concatenate([numpy.arange(k * width, (k + 1) * width) for k in order])
        nodes, gh_shape = [gh_split], self.shapes[gh]
        fixed, matmul = self.constant(gh), self.producer(gh)
        if fixed is not None:
            rows = numpy.broadcast_to(fixed, gh_shape).reshape(batch, 3 * width)
            zeros = self._constant_value(h_prev)
            return (None, rows[:, columns], nodes) if zeros is not None and not zeros.any() \
                else None
        rows = numpy.zeros((batch, 3 * width), numpy.float32)
        if matmul is not None and matmul.op_type == "Add" and len(matmul.input) == 2:
            constants = [name for name in matmul.input if self.constant(name) is not None]
            bias = self.constant(constants[0]) if len(constants) == 1 else None
            if bias is None or not _broadcasts_to(bias.shape, gh_shape):
                return None
            rows = numpy.broadcast_to(bias, gh_shape).reshape(batch, 3 * width)
            nodes.append(matmul)
            matmul = self._single_reader_producer(_other(matmul, constants[0]) or "", "MatMul",
                                                  matmul)
        weight = None if matmul is None else self.constant(matmul.input[1])
        source = None if matmul is None else self.shapes.get(matmul.input[0])
        if matmul is None or matmul.op_type != "MatMul" or weight is None or \
                weight.shape != (width, 3 * width) or source is None or \
                matmul.input[0] != h_prev or source[-1] != width or \
                prod(source) != prod(shape) or self.shapes.get(matmul.output[0]) != gh_shape:
            return None
        nodes.append(matmul)
        return numpy.ascontiguousarray(weight.T[columns]), rows[:, columns], nodes

    def _constant_parts(self, gates: tuple[NodeProto, NodeProto], gh_n: str, shape: Shape,
                        h_prev: str
                        ) -> tuple[None, numpy.ndarray, list[NodeProto]] | None:
        """A first step from h0 = 0 whose recurrent gates are three constants (XNNPACK
        may slice them from one): their rows, h_prev checked all zeros."""
        zeros = self._constant_value(h_prev)
        if zeros is None or zeros.any():
            return None
        parts = []
        for gate in gates:
            others = [name for name in gate.input if self._constant_value(name) is not None]
            if len(others) != 1:
                return None
            parts.append(others[0])
        parts.append(gh_n)
        batch = prod(shape) // shape[-1]
        rows = []
        for name in parts:
            value, part_shape = self._constant_value(name), self.shapes.get(name)
            if value is None or part_shape is None or not _broadcasts_to(part_shape, shape):
                return None
            rows.append(numpy.broadcast_to(value, shape).reshape(batch, shape[-1]))
        return None, numpy.concatenate(rows, axis=1), []

    def _constant_value(self, name: str) -> numpy.ndarray | None:
        """A constant's value, or a Slice's of one (constant bounds), or None."""
        value = self.constant(name)
        node = self.producer(name)
        if value is not None or node is None or node.op_type != "Slice" or \
                not 4 <= len(node.input) <= 5:
            return value
        data, *bounds = (self.constant(part) for part in node.input)
        if data is None or any(b is None for b in bounds):
            return None
        starts, ends, axes, *steps = (b.reshape(-1).tolist() for b in bounds if b is not None)
        index = [slice(None)] * data.ndim
        for k, axis in enumerate(axes):
            index[axis] = slice(starts[k], ends[k], steps[0][k] if steps else 1)
        result = data[tuple(index)]
        return result if result.shape == self.shapes.get(name) else None


def _other(node: NodeProto, name: str) -> str | None:
    """The operand of a two-input `node` that is not `name`."""
    others = [operand for operand in node.input if operand != name]
    return others[0] if len(node.input) == 2 and len(others) == 1 else None


def _broadcasts_to(shape: Shape | None, target: Shape) -> bool:
    try:
        return shape is not None and numpy.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _shared_row(rows: numpy.ndarray) -> numpy.ndarray | None:
    """The row every batch row equals, or None."""
    return rows[0] if (rows == rows[:1]).all() else None
