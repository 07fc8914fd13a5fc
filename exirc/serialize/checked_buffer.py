"""A FlatBuffer reader that checks every offset before using it.

The flatbuffers Python package trusts the buffer: a bad offset becomes an
IndexError, a negative `struct` offset silently reads from the end, and a
declared vector length is believed. Program files are untrusted, so this
reader checks each position against `[0, len)` before reading, checks each
vector's declared length against the bytes that remain before building
anything from it, and charges every table, vector element and string to a
work budget proportional to the buffer size. The budget is what stops a
small file whose many offsets share one sub-table (itself full of offsets to
one sub-table...) from costing exponential time: an honest FlatBuffer stores
each table once, so decoding it charges at most about its own size.

Errors are `FormatError`s naming the field path, e.g.
`execution_plan[0].chains[0].instructions[3].instr_args`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from exirc.errors import FormatError
from exirc.serialize.field_path import Path
from exirc.serialize.program.instructions import Args

T = TypeVar("T")

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_UNION_PARTS: dict[tuple[str, type], str] = {}  # a union member's field name, by member
_SIZES = {fmt: struct.calcsize("<" + fmt) for fmt in "bBhHiIqQfd"}

# Work units an honest file may need, per byte of FlatBuffer, plus a floor.
_BUDGET_PER_BYTE = 2
_BUDGET_FLOOR = 4096
_TABLE_COST = 4

# Short scalar vectors (a tensor's sizes and dim order, a call's arguments)
# that recur are one object (`CheckedBuffer.pooled`, `pooled_args`); up to this many items,
# and this many distinct vectors per file: most calls have arguments of
# their own, and a pool entry that is never shared costs more than the list.
_POOL_ITEMS = 8
_POOL_ENTRIES = 4096


class CheckedBuffer:
    """The FlatBuffer bytes plus the work budget of decoding them."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.size = len(data)
        self.budget = _BUDGET_PER_BYTE * self.size + _BUDGET_FLOOR
        # One bit per 4-byte word: whether a table or string starts there and
        # was decoded already (FlatBuffer objects are 4-aligned; a misaligned
        # one only shares a bit with its neighbour, which costs a decode).
        self._seen = bytearray((self.size >> 5) + 1)
        self._shared: dict[tuple[int, object], Any] = {}
        self._pool: dict[tuple[int, ...], list[int]] = {}
        self._args_pool: dict[bytes, Args] = {}
        # The checked (vtable length, table length) of vtables seen: an honest
        # file has a few dozen, shared by all its tables; a bounded number kept.
        self._vtables: dict[int, tuple[int, int]] = {}
        self._scalar_vectors: dict[tuple[int, str], list[int]] = {}  # `pooled_scalars`

    def once(self, view: TableView, decode: Callable[[TableView], T]) -> T:
        """`decode(view)`, made at most twice per table however often it is used.

        An honest FlatBuffer stores most tables once, and some once for many
        users on purpose (exirc shares an instruction's source frames with
        every instruction from the same line; a hostile file may point a
        million values at one table). The first use decodes; a table used
        again is decoded once more and kept, and later uses share that object,
        so memory follows the bytes of the file, not the references to them.
        """
        return self._once(view.pos, decode, view)

    def _once(self, pos: int, decode: Callable[[Any], T], arg: Any) -> T:
        word, bit = pos >> 5, 1 << ((pos >> 2) & 7)
        if not self._seen[word] & bit:
            self._seen[word] |= bit
            return decode(arg)
        key = (pos, decode)
        if key in self._shared:
            found: T = self._shared[key]
            return found
        made = self._shared[key] = decode(arg)
        return made

    def pooled(self, values: list[int]) -> list[int]:
        """`values`, or the list equal to it made before: a hundred thousand tensors
        of sizes [4] share one list, not a list each (~70 bytes, more than the file
        spends on them). Decoded programs thus share such lists: code that edits
        one in place (the mutation tools) must first give the owner its own copy."""
        if len(values) > _POOL_ITEMS:
            return values
        key = tuple(values)
        found = self._pool.get(key)
        if found is not None:
            return found
        if len(self._pool) < _POOL_ENTRIES:
            self._pool[key] = values
        return values

    def pooled_args(self, start: int, count: int) -> Args:
        """The `count` int32s at `start` (checked) as `Args`, shared with equal
        ones made before, as `pooled` shares lists (and with the same caveat)."""
        if count > _POOL_ITEMS:
            return Args.unpack(self.data, start, count)
        key = bytes(self.data[start:start + 4 * count])
        found = self._args_pool.get(key)
        if found is None:
            found = Args.unpack(key, 0, count)
            if len(self._args_pool) < _POOL_ENTRIES:
                self._args_pool[key] = found
        return found

    def charge(self, units: int, path: str | Path) -> None:
        self.budget -= units
        if self.budget < 0:
            raise FormatError(
                "decoding needs far more work than the file's size justifies "
                "(offsets share sub-tables); refusing to continue",
                field=str(path),
            )

    def check_range(self, pos: int, nbytes: int, path: str | Path) -> None:
        if pos < 0 or nbytes < 0 or pos + nbytes > self.size:
            raise FormatError(
                f"offset {pos} (+{nbytes} bytes) is outside the {self.size}-byte program data",
                field=str(path),
            )

    def read(self, fmt: struct.Struct, pos: int, path: str | Path) -> int:
        if pos < 0 or pos + fmt.size > self.size:
            self.check_range(pos, fmt.size, path)
        value: int = fmt.unpack_from(self.data, pos)[0]
        return value

    def follow(self, pos: int, path: str | Path) -> int:
        """The position a uoffset stored at `pos` points to."""
        if pos < 0 or pos + 4 > self.size:
            self.check_range(pos, 4, path)
        target: int = pos + _U32.unpack_from(self.data, pos)[0]
        return target

    def root(self) -> TableView:
        return self.table_at(self.follow(0, "root"), "root")

    def table_at(self, pos: int, path: str | Path) -> TableView:
        # The checks of `check_range`, `read` and `charge`, spelled inline: a
        # big program has millions of tables, and this is most of their cost.
        self.budget -= _TABLE_COST
        if self.budget < 0:
            self.charge(0, path)
        if pos < 0 or pos + 4 > self.size:
            self.check_range(pos, 4, path)
        vtable = pos - _I32.unpack_from(self.data, pos)[0]
        lengths = self._vtables.get(vtable)
        if lengths is None:
            lengths = self._vtable_lengths(vtable, path)
        vtable_len, table_len = lengths
        if pos + table_len > self.size:
            self.check_range(pos, table_len, path)
        return self.view(pos, vtable, vtable_len, table_len, path)

    def _vtable_lengths(self, vtable: int, path: str | Path) -> tuple[int, int]:
        """The (vtable length, table length) the vtable at `vtable` declares, checked."""
        vtable_len = self.read(_U16, vtable, Path(path, "(vtable)"))
        table_len = self.read(_U16, vtable + 2, Path(path, "(vtable)"))
        if vtable_len < 4 or vtable_len % 2:
            raise FormatError(f"vtable length {vtable_len} is invalid", field=str(path))
        if table_len < 4:
            raise FormatError(f"table length {table_len} is invalid", field=str(path))
        self.check_range(vtable, vtable_len, Path(path, "(vtable)"))
        if len(self._vtables) < _POOL_ENTRIES:
            self._vtables[vtable] = (vtable_len, table_len)
        return vtable_len, table_len

    def view(self, pos: int, vtable: int, vtable_len: int, table_len: int,
             path: str | Path) -> TableView:
        """The view of a checked table (a subclass may record or wrap it)."""
        return TableView(self, pos, vtable, vtable_len, table_len, path)


class TableView:
    """One table of the buffer; fields are read by slot number."""

    __slots__ = ("buf", "pos", "vtable", "vtable_len", "table_len", "where")

    def __init__(self, buf: CheckedBuffer, pos: int, vtable: int, vtable_len: int,
                 table_len: int, where: str | Path) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = vtable
        self.vtable_len = vtable_len
        self.table_len = table_len
        self.where = where

    @property
    def path(self) -> str:
        """Where the table is, e.g. `root.execution_plan[0].values[3]`."""
        return str(self.where)

    def field_path(self, name: str, index: int | None = None) -> Path:
        return Path(self.where, f".{name}", index)

    def _field(self, slot: int, nbytes: int, name: str) -> int | None:
        """Absolute position of field `slot`, or None when absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vtable_len:
            return None
        offset: int = _U16.unpack_from(self.buf.data, self.vtable + entry)[0]  # vtable checked
        if offset == 0:
            return None
        if offset + nbytes > self.table_len:
            raise FormatError(
                f"field lies outside its table ({offset}+{nbytes} > {self.table_len})",
                field=f"{self.path}.{name}",
            )
        return self.pos + offset

    def scalar(self, slot: int, fmt: struct.Struct, default: int | float, name: str) -> int:
        entry = 4 + 2 * slot  # `_field`, inline: the commonest read of all
        if entry + 2 > self.vtable_len:
            return default  # type: ignore[return-value]
        data = self.buf.data
        offset: int = _U16.unpack_from(data, self.vtable + entry)[0]
        if offset == 0:
            return default  # type: ignore[return-value]
        if offset + fmt.size > self.table_len:
            self._field(slot, fmt.size, name)  # raises
        value: int = fmt.unpack_from(data, self.pos + offset)[0]
        return value

    def table(self, slot: int, name: str) -> TableView | None:
        pos = self._field(slot, 4, name)
        if pos is None:
            return None
        path = Path(self.where, "." + name)
        buf = self.buf
        if pos + 4 > buf.size:
            buf.check_range(pos, 4, path)
        return buf.table_at(pos + _U32.unpack_from(buf.data, pos)[0], path)

    def _vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int] | None:
        """(first element position, element count) of a vector field."""
        pos = self._field(slot, 4, name)
        if pos is None:
            return None
        # The checks of `follow`, `read`, `check_range` and `charge` inline; the
        # field path is made only for an error (`_checked_vector` names it).
        buf = self.buf
        data, size = buf.data, buf.size
        if pos + 4 <= size:
            start = pos + _U32.unpack_from(data, pos)[0]
            if start + 4 <= size:
                count: int = _U32.unpack_from(data, start)[0]
                # Check the declared length against the bytes present before
                # anything is built from it: 0xFFFFFFFF must not allocate.
                if start + 4 + count * elem_size <= size and \
                        buf.budget >= count * max(elem_size, 1):
                    buf.budget -= count * max(elem_size, 1)
                    return start + 4, count
        return self._checked_vector(pos, elem_size, name)

    def _checked_vector(self, pos: int, elem_size: int, name: str) -> tuple[int, int]:
        """`_vector` step by step, for the error it meets."""
        path = self.field_path(name)
        start = self.buf.follow(pos, path)
        count = self.buf.read(_U32, start, path)
        self.buf.check_range(start + 4, count * elem_size, path)
        self.buf.charge(count * max(elem_size, 1), path)
        return start + 4, count

    def vector_span(self, slot: int, elem_size: int, name: str) -> tuple[int, int] | None:
        """(first element position, element count) of a vector field, checked,
        without reading its elements."""
        return self._vector(slot, elem_size, name)

    def scalars(self, slot: int, fmt: str, name: str) -> list[int]:
        """A vector of scalars, e.g. fmt "i" for [int]."""
        size = _SIZES[fmt]
        found = self._vector(slot, size, name)
        if found is None:
            return []
        start, count = found
        return list(struct.unpack_from(f"<{count}{fmt}", self.buf.data, start))

    def pooled_scalars(self, slot: int, fmt: str, name: str) -> list[int]:
        """`buf.pooled(scalars(...))`; the list of a vector the file shares (the
        writer stores equal sizes once) is read once."""
        found = self._vector(slot, _SIZES[fmt], name)
        if found is None:
            return self.buf.pooled([])
        start, count = found
        key = (start, fmt)
        made = self.buf._scalar_vectors.get(key)
        if made is None:
            made = self.buf.pooled(list(struct.unpack_from(f"<{count}{fmt}", self.buf.data,
                                                           start)))
            if count <= _POOL_ITEMS and len(self.buf._scalar_vectors) < _POOL_ENTRIES:
                self.buf._scalar_vectors[key] = made
        return made

    def int32s(self, slot: int, name: str) -> Args:
        """A vector of int32 (value indices), as `Args`, pooled (`pooled_args`)."""
        found = self._vector(slot, 4, name)
        if found is None:
            return Args()
        return self.buf.pooled_args(*found)

    def floats(self, slot: int, name: str) -> list[float]:
        found = self._vector(slot, 8, name)
        if found is None:
            return []
        start, count = found
        return list(struct.unpack_from(f"<{count}d", self.buf.data, start))

    def byte_vector(self, slot: int, name: str) -> bytes:
        found = self._vector(slot, 1, name)
        if found is None:
            return b""
        start, count = found
        return bytes(self.buf.data[start:start + count])

    def tables(self, slot: int, name: str) -> Iterator[TableView]:
        """The tables of a vector field, one at a time (a vector of a million
        tables is never a million views at once)."""
        found = self._vector(slot, 4, name)
        if found is None:
            return
        start, count = found
        buf, data, where, part = self.buf, self.buf.data, self.where, f".{name}"
        unpack = _U32.unpack_from  # the offsets are in the vector, checked
        for i in range(count):
            at = start + 4 * i
            path = Path(where, part, i)
            yield buf.table_at(at + unpack(data, at)[0], path)

    def string(self, slot: int, name: str) -> str | None:
        """A string field; one the file stores once for many tables (file names
        and code lines of stack frames) is one `str` for all of them."""
        found = self._vector(slot, 1, name)
        if found is None:
            return None
        start, count = found
        return self.string_at(start, count, name)

    def string_at(self, start: int, count: int, name: str) -> str:
        """The text of string field `name`, whose `count` bytes are at `start`."""
        return self.buf._once(start - 4, _utf8, (self, start, count, name))

    def union(self, type_slot: int, value_slot: int, name: str,
              members: tuple[type, ...]) -> tuple[type, TableView]:
        """The member class and table of a union field (NONE is an error)."""
        entry = 4 + 2 * type_slot  # `scalar`, inline, its field name made only for an error
        offset = _U16.unpack_from(self.buf.data, self.vtable + entry)[0] \
            if entry + 2 <= self.vtable_len else 0
        if offset and offset + 1 <= self.table_len:
            tag: int = self.buf.data[self.pos + offset]
        else:
            tag = self.scalar(type_slot, _U8, 0, name + "_type")
        if not 1 <= tag <= len(members):
            raise FormatError(
                f"union type tag {tag} is not one of 1..{len(members)}",
                field=f"{self.path}.{name}_type",
            )
        member = members[tag - 1]
        part = _UNION_PARTS.get((name, member))
        if part is None:
            part = _UNION_PARTS[(name, member)] = f"{name}({member.__name__})"
        table = self.table(value_slot, part)
        if table is None:
            raise FormatError("union value is missing", field=f"{self.path}.{name}")
        return member, table


def _utf8(where: tuple[TableView, int, int, str]) -> str:
    """The text of the string field `name` of a table, `count` bytes at `start`."""
    view, start, count, name = where
    try:
        return bytes(view.buf.data[start:start + count]).decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(f"string is not valid UTF-8 ({error.reason})",
                          field=f"{view.path}.{name}") from None


U8 = _U8
I8 = struct.Struct("<b")
U32 = _U32
I32 = _I32
I64 = struct.Struct("<q")
U64 = struct.Struct("<Q")
BOOL = _U8
F64 = struct.Struct("<d")
