"""`.ptd` bytes (or a path) -> `DataFile`, checking everything.

Data files are untrusted like programs: every offset, length, enum and index
is checked (`CheckedBuffer`), each segment must lie inside the segment data,
each entry's layout must be a real tensor whose bytes fit its segment, and a
key named twice is refused. A path is mapped, so the entries' bytes are
views of the file's pages, never copies.
"""

from __future__ import annotations

import os

from exirc.errors import FormatError
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import I8, U32, U64, CheckedBuffer, TableView
from exirc.serialize.data_file import FILE_IDENTIFIER, VERSION, DataFile, TensorLayout
from exirc.serialize.data_file.header import DataFileHeader
from exirc.serialize.decode import MAX_DIMS
from exirc.serialize.mapped_file import MappedFile, open_mapped
from exirc.serialize.validate import MAX_TENSOR_BYTES

DataSource = bytes | bytearray | memoryview | str | os.PathLike[str]

HINT = ("the file is not a valid .ptd data file; re-create it with "
        "`exirc compile --external-weights` (or ExecuTorch's exporter)")


def read_data_file(source: DataSource) -> DataFile:
    """Read a `.ptd` file (a path, or its bytes); FormatError if malformed."""
    return read_mapped_data_file(source)[0]


def read_mapped_data_file(source: DataSource) -> tuple[DataFile, MappedFile | None]:
    """The data file, and the mapping its bytes are views of (for a path)."""
    mapped = None
    if isinstance(source, (str, os.PathLike)):
        mapped = open_mapped(source, copy_on_write=True)
        data = mapped.view
    else:
        data = memoryview(source)
        if not data.c_contiguous:
            data = memoryview(data.tobytes())
        if data.ndim != 1 or data.itemsize != 1:
            data = data.cast("B")
    try:
        return _read(data), mapped
    except FormatError as error:
        raise FormatError(f"data file: {error.message}", hint=HINT) from None


def _read(data: memoryview) -> DataFile:
    if len(data) < 8 or bytes(data[4:8]) != FILE_IDENTIFIER:
        identifier = bytes(data[4:8]) if len(data) >= 8 else b""
        raise FormatError(f"file identifier is {identifier!r}, expected {FILE_IDENTIFIER!r}: not "
                          "a .ptd data file", field="header")
    header = DataFileHeader.parse(data)
    buf = CheckedBuffer(data[:header.flatbuffer_offset + header.flatbuffer_size])
    root = buf.root()
    version = root.scalar(0, U32, 0, "version")
    if version > VERSION:
        raise FormatError(f"version {version} is newer than this reader understands "
                          f"({VERSION})", field="version")
    segments = [_segment(t, data, header) for t in root.tables(1, "segments")]
    found = DataFile(version=version)
    for entry in root.tables(2, "entries"):
        key = entry.string(0, "key")
        if not key:
            raise FormatError("entry has no key", field=f"{entry.path}.key")
        if key in found.entries:
            raise FormatError(f"key {key!r} is named twice", field=f"{entry.path}.key")
        index = entry.scalar(1, U32, 0, "segment_index")
        if not index < len(segments):
            raise FormatError(f"index {index} is out of range: segments has "
                              f"{len(segments)} entries", field=f"{entry.path}.segment_index")
        layout_table = entry.table(2, "layout")
        layout = None if layout_table is None else _layout(layout_table)
        stored = segments[index]
        if layout is not None and layout.nbytes > len(stored):
            raise FormatError(f"{key!r} is {layout} ({layout.nbytes} bytes) but its segment "
                              f"has {len(stored)}", field=f"{entry.path}.layout")
        found.add(key, stored, layout)
    return found


def _segment(t: TableView, data: memoryview, header: DataFileHeader) -> memoryview:
    offset = t.scalar(0, U64, 0, "offset")
    size = t.scalar(1, U64, 0, "size")
    if offset + size > header.segment_data_size:
        raise FormatError(f"segment of {size} bytes at offset {offset} runs past the "
                          f"{header.segment_data_size} bytes of segment data", field=t.path)
    start = header.segment_base_offset + offset
    return data[start:start + size]


def _layout(t: TableView) -> TensorLayout:
    raw = t.scalar(0, I8, 0, "scalar_type")
    try:
        scalar_type = P.ScalarType(raw)
    except ValueError:
        raise FormatError(f"{raw} is not a valid ScalarType",
                          field=f"{t.path}.scalar_type") from None
    sizes = t.scalars(1, "i", "sizes")
    if len(sizes) > MAX_DIMS:
        raise FormatError(f"{len(sizes)} dims, more than the {MAX_DIMS} a tensor may have",
                          field=f"{t.path}.sizes")
    extent = scalar_type.itemsize
    for i, size in enumerate(sizes):
        if size < 0:
            raise FormatError(f"size {size} is negative", field=f"{t.path}.sizes[{i}]")
        extent *= max(size, 1)
        if extent > MAX_TENSOR_BYTES:
            raise FormatError("the tensor needs more than 2**48 bytes, implausibly many",
                              field=f"{t.path}.sizes")
    dim_order = t.scalars(2, "B", "dim_order")
    if dim_order and sorted(dim_order) != list(range(len(sizes))):
        raise FormatError(f"{dim_order} is not a permutation of the {len(sizes)} dimensions",
                          field=f"{t.path}.dim_order")
    return TensorLayout(scalar_type, tuple(sizes),
                        tuple(dim_order) or tuple(range(len(sizes))))
