"""Bundled test cases: inputs and expected outputs stored inside the program.

`exirc compile --bundle` stores, per method, the inputs it was verified on
and eager PyTorch's outputs for them; `exirc run --check` runs them again
and compares (`exirc.diagnostics.bundle` makes and checks them). ExecuTorch
keeps such cases in a separate file format (`.bpte`); ours live in a
named-data segment (`NAMED_DATA_KEY`) of the program itself, which
ExecuTorch's runtime never asks for and so ignores: the file stays a normal
program everywhere. This module is that segment's format.

The segment (all integers little-endian, as in the rest of the file):

    0   magic b"EXIRCBIO"
    8   u32 format version (1)
    12  u32 header length H
    16  header: H bytes of UTF-8 JSON
        padding to a 16-byte boundary
    D   tensor data, each tensor's bytes at a 16-aligned offset from D

    header = {"rtol": 1e-4, "atol": 1e-5, "cases": [
        {"method": "forward",
         "inputs":  [VALUE, ...],
         "outputs": [VALUE or null, ...]},    # null: an output not checked
    ]}
    VALUE = {"dtype": "float32", "shape": [2, 8], "offset": 0}   # a tensor
          | {"int": 3} | {"bool": true} | {"float": "0.5"}     # floats as text: nan, inf

Nothing is pickled or evaluated. The file may be hostile, so `decode`
checks every field (sizes computed with Python ints, every tensor inside the
data) and bounds the header, the number of cases and of values, and raises
`FormatError` naming the field. This module imports neither torch nor numpy
(`exirc inspect` reads it).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, TypeGuard

from exirc.errors import FormatError, UsageError
from exirc.serialize import program as P

NAMED_DATA_KEY = "exirc.bundled_io"  # a key in files: never renamed
MAGIC = b"EXIRCBIO"
FORMAT_VERSION = 1
ALIGNMENT = 16
MAX_HEADER_BYTES = 1 << 22
MAX_CASES = 4096
MAX_VALUES = 4096  # inputs plus outputs of one case
MAX_DIMS = 32
# Ints, dims and offsets the header may hold: int64's range (what a program's
# scalars are); more would make size arithmetic, and printing, unbounded.
MAX_INT = (1 << 63) - 1
MAX_BUNDLE_BYTES = 1 << 28  # what `--bundle` agrees to store
_PREFIX = struct.Struct("<8sII")
SEGMENT_FIELD = f"named_data[{NAMED_DATA_KEY!r}]"  # how errors name the segment

# Element types by the names torch gives them, and their sizes.
ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint16": 2, "uint32": 4, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4,
    "float64": 8, "complex64": 8, "complex128": 16,
}


@dataclass(frozen=True)
class BundledTensor:
    dtype: str  # a key of ITEMSIZE
    shape: tuple[int, ...]
    data: bytes | memoryview  # little-endian, C order

    def describe(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


BundledValue = BundledTensor | bool | int | float


@dataclass(frozen=True)
class BundledCase:
    method: str
    inputs: tuple[BundledValue, ...]
    outputs: tuple[BundledValue | None, ...]  # one per program output; None: not checked
    # For a method with program state: 0 runs from the initial state, k > 0
    # right after call k - 1 (the case before it).
    call: int = 0


@dataclass(frozen=True)
class Bundle:
    cases: tuple[BundledCase, ...]
    rtol: float
    atol: float

    def counts(self) -> dict[str, int]:
        """Cases per method, in the order methods first appear."""
        counts: dict[str, int] = {}
        for case in self.cases:
            counts[case.method] = counts.get(case.method, 0) + 1
        return counts

    def numbered(self) -> list[tuple[int, BundledCase]]:
        """Each case with its number among its method's cases (`forward case 1`)."""
        seen: dict[str, int] = {}
        numbered = []
        for case in self.cases:
            number = seen.get(case.method, 0)
            seen[case.method] = number + 1
            numbered.append((number, case))
        return numbered


# ---------------------------------------------------------------------------
# The program's segment.
# ---------------------------------------------------------------------------


def read_bundle(program: P.Program) -> Bundle | None:
    """The program's bundled cases, or None if it has none; FormatError if malformed."""
    data = program.named_segment(NAMED_DATA_KEY)
    return decode(data) if data is not None else None


def write_bundle(program: P.Program, bundle: Bundle) -> None:
    """Store `bundle` in `program`, replacing cases it already has."""
    data = encode(bundle)
    for named in program.named_data:
        if named.key == NAMED_DATA_KEY and 0 <= named.segment_index < len(program.segments):
            program.segments[named.segment_index] = P.DataSegment(data)
            return
    program.add_named_segment(NAMED_DATA_KEY, data)


# ---------------------------------------------------------------------------
# Encoding.
# ---------------------------------------------------------------------------


def encode(bundle: Bundle) -> bytes:
    blob = bytearray()

    def value(item: BundledValue | None) -> Any:
        if item is None:
            return None
        if isinstance(item, BundledTensor):
            offset = _align(len(blob))
            blob.extend(bytes(offset - len(blob)))
            blob.extend(item.data)
            return {"dtype": item.dtype, "shape": list(item.shape), "offset": offset}
        if isinstance(item, bool):
            return {"bool": item}
        if isinstance(item, int):
            return {"int": item}
        return {"float": repr(float(item))}

    cases = [{"method": case.method, "inputs": [value(v) for v in case.inputs],
              "outputs": [value(v) for v in case.outputs],
              **({"call": case.call} if case.call else {})} for case in bundle.cases]
    header = json.dumps({"rtol": bundle.rtol, "atol": bundle.atol, "cases": cases},
                        separators=(",", ":")).encode()
    start = _align(_PREFIX.size + len(header))
    data = (_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header
            + bytes(start - _PREFIX.size - len(header)) + bytes(blob))
    if len(data) > MAX_BUNDLE_BYTES:
        raise UsageError(f"the bundled test cases take {len(data)} bytes, more than "
                         f"{MAX_BUNDLE_BYTES} allowed",
                         hint="bundle smaller inputs (--verify-inputs in.npz)")
    return data


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


# ---------------------------------------------------------------------------
# Decoding, checked.
# ---------------------------------------------------------------------------


class _Malformed(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def decode(data: bytes | memoryview) -> Bundle:
    """Parse and check a bundle segment; FormatError naming the bad field."""
    try:
        return _decode(memoryview(data))
    except _Malformed as error:
        raise FormatError(str(error), field=f"{SEGMENT_FIELD}{error.field}",
                          hint="the bundled test cases are damaged; compile again with "
                               "`exirc compile --bundle`") from None


def _decode(data: memoryview) -> Bundle:
    if len(data) < _PREFIX.size:
        raise _Malformed("", f"{len(data)} bytes, too short for the {_PREFIX.size}-byte prefix")
    magic, version, header_size = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise _Malformed(".magic", f"{magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise _Malformed(".version", f"format version {version}; this exirc reads "
                                     f"{FORMAT_VERSION}")
    if header_size > MAX_HEADER_BYTES or _PREFIX.size + header_size > len(data):
        raise _Malformed(".header", f"header of {header_size} bytes does not fit (segment of "
                                    f"{len(data)} bytes, at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(bytes(data[_PREFIX.size:_PREFIX.size + header_size]))
    except RecursionError:  # Python's JSON parser recurses into nested lists
        raise _Malformed(".header", "JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise _Malformed(".header", f"not JSON: {error}") from None
    blob = data[_align(_PREFIX.size + header_size):]
    if not isinstance(header, dict):
        raise _Malformed(".header", "not a JSON object")
    rtol = _tolerance(header.get("rtol"), ".rtol")
    atol = _tolerance(header.get("atol"), ".atol")
    cases = header.get("cases")
    if not isinstance(cases, list) or len(cases) > MAX_CASES:
        raise _Malformed(".cases", f"a list of at most {MAX_CASES} cases expected")
    return Bundle(tuple(_case(c, blob, f".cases[{i}]") for i, c in enumerate(cases)), rtol, atol)


def _tolerance(value: Any, field: str) -> float:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise _Malformed(field, "an integer beyond int64 is not a tolerance")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise _Malformed(field, f"{value!r:.40} is not a tolerance")
    return float(value)


def _case(entry: Any, blob: memoryview, field: str) -> BundledCase:
    if not isinstance(entry, dict):
        raise _Malformed(field, "not an object")
    method = entry.get("method")
    inputs, outputs = entry.get("inputs"), entry.get("outputs")
    if not isinstance(method, str) or not method or len(method) > 256:
        raise _Malformed(f"{field}.method", f"{method!r:.40} is not a method name")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or \
            len(inputs) + len(outputs) > MAX_VALUES:
        raise _Malformed(field, f"inputs and outputs must be lists of at most {MAX_VALUES} "
                                "values together")
    call = entry.get("call", 0)
    if isinstance(call, bool) or not isinstance(call, int) or not 0 <= call <= MAX_CASES:
        raise _Malformed(f"{field}.call", f"{call!r:.40} is not a call number")
    return BundledCase(
        method,
        tuple(_value(v, blob, f"{field}.inputs[{i}]") for i, v in enumerate(inputs)),
        tuple(None if v is None else _value(v, blob, f"{field}.outputs[{i}]")
              for i, v in enumerate(outputs)),
        call)


def _value(entry: Any, blob: memoryview, field: str) -> BundledValue:
    if not isinstance(entry, dict) or len(entry) not in (1, 3):
        raise _Malformed(field, "not a value")
    if "dtype" in entry:
        return _tensor(entry, blob, field)
    ((kind, item),) = entry.items()
    if kind == "bool" and isinstance(item, bool):
        return item
    if kind == "int" and isinstance(item, int) and not isinstance(item, bool) and \
            -MAX_INT - 1 <= item <= MAX_INT:
        return item
    if kind == "float" and isinstance(item, str) and len(item) <= 64:
        try:
            return float(item)
        except ValueError:
            pass
    raise _Malformed(field, f"{kind!r:.20}: {item!r:.40} is not a value")


def _count(value: Any) -> TypeGuard[int]:
    """Whether `value` is an int in 0..MAX_INT (a dim, an offset)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _tensor(entry: dict[str, Any], blob: memoryview, field: str) -> BundledTensor:
    dtype, shape, offset = entry.get("dtype"), entry.get("shape"), entry.get("offset")
    if dtype not in ITEMSIZE:
        raise _Malformed(f"{field}.dtype", f"{dtype!r:.40} is not a dtype (known: "
                                           f"{', '.join(ITEMSIZE)})")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            _count(d) for d in shape):
        raise _Malformed(f"{field}.shape", f"{shape!r:.60} is not a shape")
    if not _count(offset):
        raise _Malformed(f"{field}.offset", f"{offset!r:.40} is not an offset")
    nbytes = math.prod(shape) * ITEMSIZE[dtype]  # Python ints: no overflow
    if offset + nbytes > len(blob):
        raise _Malformed(field, f"{dtype}{shape} needs bytes {offset}..{offset + nbytes}, "
                                f"but the data has {len(blob)}")
    data = blob[offset:offset + nbytes]
    if dtype == "bool" and bytes(data).translate(None, b"\x00\x01"):
        raise _Malformed(field, "a bool tensor holds bytes other than 0 and 1")
    return BundledTensor(dtype, tuple(shape), data)
