"""What a node builder sees while it compiles one node: its values, checked.

Compiling turns each node into a closure over precomputed parameters and
value-table slots. Builders get a `NodeContext` that resolves value ids to
slots and checks, as it goes, what the file says about them: the id names a
value; a value is read only after something defined it (an external input,
a constant, an earlier node); a node writes only fresh values (never an
input, a constant, or a value another node wrote); the datatypes are ones
the node computes on. Every failure names the node, so a hostile or broken
blob is refused at init with a message that says where.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from exirc.errors import FormatError, UnsupportedOperatorError
from exirc.runtime.delegates.xnnpack.constants import FLOAT_TYPES, ConstantSource, datatype_name
from exirc.serialize.xnnpack import graph as G

Env = list[Any]
"""The value table of one call: one tensor (or None) per value slot."""

Op = Callable[[Env], None]
"""A compiled node: reads its inputs from the table and writes its outputs."""

CLAMPED_KINDS = frozenset({
    G.NodeKind.ADD, G.NodeKind.SUBTRACT, G.NodeKind.MULTIPLY, G.NodeKind.DIV,
    G.NodeKind.FULLY_CONNECTED, G.NodeKind.CLAMP, G.NodeKind.CONV2D,
    G.NodeKind.DEPTHWISE_CONV2D, G.NodeKind.CONV_TRANSPOSE2D, G.NodeKind.AVG_POOLING_2D,
    G.NodeKind.MAX_POOLING_2D, G.NodeKind.GLOBAL_AVG_POOLING_2D,
})
"""The node kinds whose `output_min_max` clamps their output. ExecuTorch's
runtime passes it to XNNPACK for these and ignores it on the others, so we do too."""


class NodeContext:
    """One node being compiled: its values by id, and the checks on them."""

    def __init__(self, index: int, node: G.Node, values: dict[int, tuple[int, G.TensorValue]],
                 defined: set[int], constants: dict[int, torch.Tensor], where: str,
                 source: ConstantSource | None = None,
                 shapes: dict[int, tuple[int, ...]] | None = None) -> None:
        self.index = index
        self.node = node
        self.kind = node.kind
        self._values = values
        self._defined = defined
        self._constants = constants
        self.where = where
        self.source = source  # for quantization scales kept as constants
        self._shapes = shapes if shapes is not None else {}  # inferred dims, by slot
        self.written: list[int] = []  # slots this node writes, in order
        self.reads: list[int] = []  # slots this node reads
        self.narrow = False  # it touches fp16 or bf16 values

    # -- messages ------------------------------------------------------------

    @property
    def label(self) -> str:
        return f"node {self.index} ({self.kind.name.lower()})"

    def fail(self, message: str) -> FormatError:
        """The error for a node that contradicts itself or its values."""
        return FormatError(f"{self.label}: {message}", field=self.where)

    def unsupported(self, message: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError(
            f"XNNPACK {self.label}: {message}",
            hint="exirc's XNNPACK backend runs float graphs and the quantized nodes "
                 "ExecuTorch's quantizers emit (see `exirc.runtime.delegates.xnnpack`); lower "
                 "this part of the model without quantization, or leave it to the portable kernels")

    # -- values --------------------------------------------------------------

    def value(self, value_id: int, role: str) -> G.TensorValue:
        entry = self._values.get(value_id)
        if entry is None:
            raise self.fail(f"its {role} is value {_id(value_id)}, which the graph does not "
                            "define")
        return entry[1]

    def read(self, value_id: int, role: str) -> int:
        """The slot of an input value, which must already be defined."""
        entry = self._values.get(value_id)
        if entry is None:
            raise self.fail(f"its {role} is value {_id(value_id)}, which the graph does not "
                            "define")
        if entry[0] not in self._defined:
            raise self.fail(f"reads value {value_id} ({role}) before any node writes it")
        self.reads.append(entry[0])
        return entry[0]

    def write(self, value_id: int, role: str = "output") -> int:
        """The slot of an output value, which must be fresh."""
        entry = self._values.get(value_id)
        if entry is None:
            raise self.fail(f"its {role} is value {_id(value_id)}, which the graph does not "
                            "define")
        slot, value = entry
        if value.constant_buffer_idx:
            raise self.fail(f"writes value {value_id}, a constant")
        if value.flags & G.FLAG_EXTERNAL_INPUT:
            raise self.fail(f"writes value {value_id}, an external input")
        if slot in self._defined:
            raise self.fail(f"writes value {value_id}, which an earlier node already wrote")
        self._defined.add(slot)
        self.written.append(slot)
        return slot

    def constant(self, value_id: int) -> torch.Tensor | None:
        """The tensor of a constant value (resolved once, at init; fp16 and bf16
        ones already in float32, the type nodes compute in), or None."""
        return self._constants.get(value_id)

    def dims(self, value_id: int) -> list[int]:
        """The value's dims: as inferred from the graph's inputs once an earlier node
        produced it (see `shapecheck`), else as declared."""
        entry = self._values.get(value_id)
        if entry is not None and entry[0] in self._shapes:
            return list(self._shapes[entry[0]])
        return list(self.value(value_id, "value").dims)

    # -- datatypes -----------------------------------------------------------

    def require_float(self, ids: Iterable[tuple[int, str]]) -> None:
        """All of `ids` (value, role) must be float values; anything else is refused.

        fp16 and bf16 values are computed in float32 and rounded to their own
        type when written (see `compile._narrow`); mixing them with fp32 (fp32
        weights in an fp16 graph, as ExecuTorch writes for convolutions) is fine.
        """
        for value_id, role in ids:
            value = self.value(value_id, role)
            if value.datatype not in FLOAT_TYPES or value.quant is not None:
                raise self.unsupported(
                    f"its {role} (value {value_id}) has datatype "
                    f"{datatype_name(value.datatype)}; exirc implements this kind on float "
                    "values only")
            if value.datatype != G.Datatype.FP32:
                self.narrow = True

    def check_flags(self, flags: int, allowed: int = 0, names: str = "") -> None:
        """Refuse flags we do not implement (they would change the result)."""
        unknown = flags & ~allowed
        if unknown:
            known = f" (we implement {names})" if names else ""
            raise self.unsupported(f"has flags {unknown:#x}, which exirc does not "
                                   f"implement{known}")

    # -- fused clamp ---------------------------------------------------------

    def clamp_bounds(self) -> tuple[float, float] | None:
        """The node's output clamp, if it has one that does anything."""
        if self.kind not in CLAMPED_KINDS or self.node.output_min_max is None:
            return None
        low, high = self.node.output_min_max
        if low != low or high != high or not low < high:  # NaN, or an empty range
            raise self.fail(f"its output range [{low}, {high}] is empty")
        if low == float("-inf") and high == float("inf"):
            return None
        return float(low), float(high)


def _id(value_id: int) -> str:
    return "none" if value_id == G.INVALID_VALUE_ID else str(value_id)
