"""A FlatBuffer reader that charges the bytes of every object it visits to a
row of the size report.

The size report decodes a FlatBuffer again with it (the program's, an
XNNPACK payload's graph). Each table, vtable, vector (its length prefix
apart) and string is charged, as it is visited, to the row its place in the
buffer names (`Rules`: a method's values, instructions...). A byte goes to
the first object visited that covers it, so a vtable or string shared by
many tables counts once, and overlapping objects of a hostile file never
count twice. Nothing is kept per object: a bitmap of the bytes already
charged (a bit per byte of the window) and a total per row, so the
report costs the size of the buffer, not the number of objects in it.
It is the checked reader, so a hostile buffer fails the same way it fails
when read for real.
"""

from __future__ import annotations

from typing import Any, Protocol

from exirc.inspector.size_ledger import Ledger, RowKey
from exirc.serialize.checked_buffer import CheckedBuffer, Path, TableView

# Shared vtables and vectors remembered as charged (an honest file has a few
# dozen; a hostile one cannot grow the sets past this).
_REMEMBERED = 4096


class Charger:
    """Charges the bytes of the window [lo, hi) of the file to rows, each
    byte once. Positions are file offsets; which bytes are charged already is
    one bit per byte."""

    def __init__(self, ledger: Ledger, lo: int, hi: int) -> None:
        self.ledger = ledger
        self.lo = lo
        self.hi = max(lo, hi)
        self.claimed = bytearray((self.hi - lo + 7) // 8)
        self.charged = 0

    def charge(self, start: int, end: int, key: RowKey) -> None:
        lo = self.lo
        a = start - lo if start > lo else 0
        b = (end if end < self.hi else self.hi) - lo
        if a >= b:
            return
        first, last = a >> 3, (b - 1) >> 3
        mask = ((1 << (b - a)) - 1) << (a & 7)
        claimed = self.claimed
        bits = int.from_bytes(claimed[first:last + 1], "little")
        taken = bits & mask
        free = (b - a) - taken.bit_count() if taken else b - a
        if not free:
            return
        self.ledger.charge(key, free)
        self.charged += free
        claimed[first:last + 1] = (bits | mask).to_bytes(last + 1 - first, "little")

    def rest(self, key: RowKey) -> None:
        """The bytes of the window nothing claimed, to `key`."""
        left = (self.hi - self.lo) - self.charged
        if left:
            self.ledger.charge(key, left)
            self.charged += left


State = Any  # what a `Rules` knows of a table: its row, and what its fields are


class Rules(Protocol):
    """Which row each object of one kind of FlatBuffer goes to."""

    root: State

    def row(self, state: State) -> RowKey:
        """The row of a table (and its vtable) in `state`."""

    def child(self, state: State, part: str, index: int | None) -> State:
        """The state of a table at field `part` (`.name`, or `.name(Member)` for
        a union) of a table in `state`; `index` when it is a vector's element."""

    def vector(self, state: State, name: str, charger: Charger, length: int, start: int,
               end: int) -> None:
        """Charge vector or string field `name` of a table in `state`: its length
        prefix at `length`, its elements [start, end)."""


class ChargingRecorder(CheckedBuffer):
    """A checked reader of the FlatBuffer `data`, which starts at file offset
    `base`, charging what it visits through `charger` by `rules`."""

    def __init__(self, data: bytes | memoryview, base: int, charger: Charger,
                 rules: Rules) -> None:
        super().__init__(data)
        self.base = base
        self.charger = charger
        self.rules = rules
        self._vtables_charged: set[int] = set()
        self.vectors_charged: set[tuple[State, str, int, int]] = set()

    def view(self, pos: int, vtable: int, vtable_len: int, table_len: int,
             path: str | Path) -> TableView:
        rules = self.rules
        if type(path) is Path:
            parent = path.parent.note if type(path.parent) is Path else rules.root
            state = path.note = rules.child(parent, path.part, path.index)
        else:
            state = rules.root
        row = rules.row(state)
        base = self.base
        self.charger.charge(base + pos, base + pos + table_len, row)
        # Most tables share a vtable with thousands of others: once charged,
        # it has no free byte left, which the set says without the bitmap.
        if vtable not in self._vtables_charged:
            self.charger.charge(base + vtable, base + vtable + vtable_len, row)
            if len(self._vtables_charged) < _REMEMBERED:
                self._vtables_charged.add(vtable)
        return _ChargingTable(self, pos, vtable, vtable_len, table_len, path, state)


class _ChargingTable(TableView):
    __slots__ = ("state",)

    def __init__(self, buf: ChargingRecorder, pos: int, vtable: int, vtable_len: int,
                 table_len: int, where: str | Path, state: State) -> None:
        # TableView's fields set here, not through super(): millions of tables.
        self.buf, self.pos, self.vtable, self.vtable_len = buf, pos, vtable, vtable_len
        self.table_len, self.where, self.state = table_len, where, state

    def _vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int] | None:
        found = super()._vector(slot, elem_size, name)
        if found is not None:
            start, count = found
            buf = self.buf
            assert isinstance(buf, ChargingRecorder)
            # A vector the file shares (a tensor's sizes) is charged at its
            # first visit; the same charge again claims nothing more.
            key = (self.state, name, start, count * elem_size)
            if key not in buf.vectors_charged:
                base = buf.base
                buf.rules.vector(self.state, name, buf.charger, base + start - 4, base + start,
                                 base + start + count * elem_size)
                if len(buf.vectors_charged) < _REMEMBERED:
                    buf.vectors_charged.add(key)
        return found

    def string(self, slot: int, name: str) -> str | None:
        found = self._vector(slot, 1, name)  # charges the length prefix and the bytes
        if found is None:
            return None
        start, count = found
        buf = self.buf
        assert isinstance(buf, ChargingRecorder)
        end = buf.base + start + count  # the terminating zero
        buf.rules.vector(self.state, name, buf.charger, end, end, end + 1)
        return self.string_at(start, count, name)
