"""Hostile input files for `exirc run --inputs`: .npz archives whose arrays lie.

The archive is well-formed (a zip with good CRCs) so the mutant reaches the
.npy reader: a header claiming a huge, negative or many-dimensional shape,
another dtype (object, unicode, big-endian, complex, nonsense), Fortran
order, data cut short or padded, a header length that lies, a member name
the method does not take.
"""

from __future__ import annotations

import io
import random
import zipfile
from collections.abc import Mapping

import numpy

_SHAPES = ["(1099511627776,)", "(-1,)", "(2, -3)", "()", "(0,)", "(" + "1, " * 70 + ")",
           "(4294967296, 4294967296)", "(1, 2, 3, 4, 5, 6, 7, 8, 9)"]
_DESCRS = ["'|O'", "'<U10'", "'>f4'", "'<c16'", "'V8'", "'xyz'", "'<i8'", "'<f8'", "'|b1'",
           "'<f2'", "[('a', '<f4')]"]


def hostile_npz(arrays: Mapping[str, numpy.ndarray], rng: random.Random) -> tuple[bytes, str]:
    """An .npz of `arrays` with one of them (or the archive's names) bent."""
    members = {name: _npy(array) for name, array in arrays.items()}
    if not members:
        return _zip({"input_0.npy": _npy(numpy.zeros(2, numpy.float32))}), "an unasked input"
    name = rng.choice(sorted(members))
    data = members[name]
    action = rng.choice(["shape", "shape", "descr", "descr", "fortran", "cut", "pad",
                         "header_length", "rename"])
    if action == "shape":
        new = rng.choice(_SHAPES)
        data, what = _header(data, "'shape': ", new), f"{name} shape {new}"
    elif action == "descr":
        new = rng.choice(_DESCRS)
        data, what = _header(data, "'descr': ", new), f"{name} dtype {new}"
    elif action == "fortran":
        data, what = data.replace(b"False", b"True ", 1), f"{name} in Fortran order"
    elif action == "cut":
        cut = rng.randrange(len(data))
        data, what = data[:cut], f"{name} cut to {cut} bytes"
    elif action == "pad":
        data, what = data + bytes(rng.choice([1, 7, 4096])), f"{name} with bytes after its data"
    elif action == "header_length":
        length = rng.choice([0, 1, 0xFFFF, 7])
        data = data[:8] + length.to_bytes(2, "little") + data[10:]
        what = f"{name} header length {length}"
    else:
        members[f"{name}_renamed"] = members.pop(name)
        return _zip({f"{k}.npy": v for k, v in members.items()}), f"{name} renamed"
    members[name] = data
    return _zip({f"{k}.npy": v for k, v in members.items()}), what


def _npy(array: numpy.ndarray) -> bytes:
    out = io.BytesIO()
    numpy.lib.format.write_array(out, array, allow_pickle=False)
    return out.getvalue()


def _header(data: bytes, key: str, value: str) -> bytes:
    """`data` (a version 1 .npy) with the header's `key` set to `value`, the
    header padded again to a multiple of 64 bytes as the format wants."""
    length = int.from_bytes(data[8:10], "little")
    header = data[10:10 + length].decode("latin1")
    start = header.index(key) + len(key)
    end = header.index(", '", start) if ", '" in header[start:] else header.index("}", start)
    if value.startswith("(") and header[start] == "(":
        end = header.index(")", start) + 1
    text = (header[:start] + value + header[end:]).rstrip()
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    return data[:8] + len(text).to_bytes(2, "little") + text.encode("latin1") + \
        data[10 + length:]


def _zip(members: Mapping[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()
