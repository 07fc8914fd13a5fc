"""The facts `exirc inspect` reports about one quantized tensor, their text
(shared by the view and the listing), and the reading of scales and zero
points stored as bytes.

Both sources of quantization (kernel calls, `quantization.py`; XNNPACK
payloads, `quantization_xnnpack.py`) describe a tensor with the same
`QuantizedTensor`, so the JSON and the text treat them alike. Anything the
file leaves unknown (a missing argument, one of the wrong kind, bytes that
are not there) is `None`: `null` in JSON, `?` in text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy

from exirc.serialize import program as P

# A scale or zero point list longer than this is summarized (count, min, max):
# per-group scales of a large embedding run to millions.
MAX_VALUES = 16

Number = int | float | str  # str: a non-finite float ("nan", "inf"), which JSON cannot hold

# Where a scale or zero point comes from.
LITERAL = "literal"      # a number in the instruction or the XNNPACK value
CONSTANT = "constant"    # a constant tensor, whose values the file holds
RUN_TIME = "run_time"    # computed when the program runs (dynamic quantization)
EXTERNAL = "external"    # a constant kept outside the file (a .ptd)
NONE = "none"            # an omitted optional argument: ExecuTorch's kernels take 0
IMPLICIT = "implicit"    # not stored: the format fixes it (XNNPACK's symmetric weights)
UNKNOWN = "unknown"      # the argument is missing or of a kind that cannot hold it


def number(x: float | int) -> Number:
    """A JSON-safe number: strict JSON readers (jq) refuse NaN and Infinity."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


@dataclass
class Params:
    """A scale or zero point: where it comes from and, when the file holds
    them, its values (all of them when few, always the count and range)."""

    source: str
    value: int | None = None  # the EValue holding it (kernel calls)
    shape: list[int] | None = None
    count: int | None = None
    values: list[Number] | None = None
    min: Number | None = None
    max: Number | None = None

    @classmethod
    def literal(cls, x: float | int) -> Params:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return cls(UNKNOWN)
        return cls(LITERAL, count=1, values=[number(x)], min=number(x), max=number(x))

    @classmethod
    def of_array(cls, source: str, array: numpy.ndarray | None, count: int | None,
                 **where: Any) -> Params:
        """From the decoded values, or with only the count when they did not read.
        Only a few values become Python numbers: scales run to millions."""
        if array is None or array.size == 0:
            return cls(source, count=count, **where)
        values = [number(x) for x in array.tolist()] if array.size <= MAX_VALUES else None
        # nanmin would hide a NaN scale, which is the thing worth seeing.
        low, high = array.min().item(), array.max().item()
        return cls(source, count=int(array.size), values=values, min=number(low),
                   max=number(high), **where)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Use:
    """An instruction (kernel call) or XNNPACK node that names a quantized
    tensor, as which argument, and whether it writes the tensor."""

    arg: str
    writes: bool
    op: str = ""         # kernel calls: the operator's qualified name
    chain: int = 0
    index: int = 0
    node: int | None = None  # XNNPACK: the node's index in the graph
    kind: str = ""       # XNNPACK: the node kind, e.g. `conv2d`

    def to_json(self) -> dict[str, Any]:
        if self.node is not None:
            return {"node": self.node, "kind": self.kind, "arg": self.arg,
                    "writes": self.writes}
        return {"chain": self.chain, "index": self.index, "op": self.op, "arg": self.arg,
                "writes": self.writes}


@dataclass
class QuantizedTensor:
    """One quantized tensor: an EValue of a method (`value`), or a value of an
    XNNPACK graph (`delegate`, `xnnpack_value`)."""

    method: str
    type: str            # as the listing writes it: `i8[1, 3, 6, 6]`, `qcint8[4, 3, 3, 3]`
    dtype: str | None    # the integer type: `i8`, `i4` (packed in u8), `qcint4`
    scheme: str | None   # per_tensor, per_channel, per_group, per_token
    scale: Params
    zero_point: Params
    value: int | None = None
    delegate: int | None = None
    xnnpack_value: int | None = None
    dynamic: bool = False
    axis: int | None = None
    group_size: int | None = None
    quant_min: int | None = None
    quant_max: int | None = None
    # constant, input, or computed (written as the program runs); None: not a tensor
    origin: str | None = "computed"
    uses: list[Use] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "delegate": self.delegate, "value": self.value,
            "xnnpack_value": self.xnnpack_value, "type": self.type, "dtype": self.dtype,
            "scheme": self.scheme, "dynamic": self.dynamic, "axis": self.axis,
            "group_size": self.group_size, "scale": self.scale.to_json(),
            "zero_point": self.zero_point.to_json(), "quant_min": self.quant_min,
            "quant_max": self.quant_max, "origin": self.origin,
            "uses": [use.to_json() for use in self.uses],
        }


def scheme_text(t: dict[str, Any]) -> str:
    """`per-tensor`, `per-channel axis 0`, `per-group size 32`, `dynamic per-token`."""
    scheme = t.get("scheme")
    if scheme is None and t.get("dynamic"):
        return "dynamic"  # XNNPACK's dq_datatype inputs: the payload says no more
    text = "?" if scheme is None else str(scheme).replace("_", "-")
    if scheme == "per_channel":
        text += f" axis {or_unknown(t.get('axis'))}"
    elif scheme == "per_group":
        text += f" size {or_unknown(t.get('group_size'))}"
    return ("dynamic " if t.get("dynamic") else "") + text


def params_text(one: str, many: str, p: dict[str, Any]) -> str:
    """A scale or zero point (`Params.to_json()`) as text: `scale=0.5`,
    `4 scales 0.00144..0.00151`, `zp=0 (all 4)`, `scale=%9` (computed as the
    program runs), `zp=none`, `scale=?`."""
    source = p["source"]
    if source == RUN_TIME:
        return f"{one}=%{p['value']}" if p["value"] is not None else f"{one}=(run time)"
    if source == NONE:
        return f"{one}=none"
    if source == EXTERNAL:
        return f"{one}=(external data)"
    if source == UNKNOWN:
        return f"{one}=?"
    count, low, high = p["count"], p["min"], p["max"]
    if count == 1 and low is not None:
        return f"{one}={_short(low)}"
    if low is None:
        return f"{one}=?" if count is None else f"{count} {many} ?"
    if low == high:
        return f"{one}={_short(low)} (all {count})"
    return f"{count} {many} {_short(low)}..{_short(high)}"


def _short(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def or_unknown(x: Any) -> str:
    return "?" if x is None else str(x)


# -- numbers stored as bytes --------------------------------------------------------

# Program files are little-endian whatever the host; numpy reads them as such.
_NUMPY_TYPES: dict[P.ScalarType, str] = {
    P.ScalarType.BYTE: "u1", P.ScalarType.CHAR: "i1", P.ScalarType.SHORT: "<i2",
    P.ScalarType.INT: "<i4", P.ScalarType.LONG: "<i8", P.ScalarType.HALF: "<f2",
    P.ScalarType.FLOAT: "<f4", P.ScalarType.DOUBLE: "<f8", P.ScalarType.QINT8: "i1",
    P.ScalarType.QUINT8: "u1", P.ScalarType.QINT32: "<i4", P.ScalarType.UINT16: "<u2",
    P.ScalarType.UINT32: "<u4", P.ScalarType.UINT64: "<u8",
}


def decode(data: bytes | memoryview, scalar_type: P.ScalarType | str, count: int
           ) -> numpy.ndarray | None:
    """The first `count` numbers of `data`, or None when there are fewer bytes
    or the type holds no plain numbers. `scalar_type` "bf16" reads bfloat16
    (XNNPACK's block scales), which numpy has no type for."""
    if count < 0:
        return None
    if scalar_type in ("bf16", P.ScalarType.BFLOAT16):
        if len(data) < 2 * count:
            return None
        # bfloat16 is the top half of a float32.
        halves = numpy.frombuffer(data, dtype="<u2", count=count).astype(numpy.uint32)
        return (halves << 16).view(numpy.float32)
    dtype = _NUMPY_TYPES.get(scalar_type) if isinstance(scalar_type, P.ScalarType) else None
    if dtype is None or len(data) < numpy.dtype(dtype).itemsize * count:
        return None
    # A view of the file's bytes, not a copy: `.item()` and `.tolist()` give each
    # stored value exactly as a Python number (floats widen to float64 exactly).
    return numpy.frombuffer(data, dtype=dtype, count=count)
