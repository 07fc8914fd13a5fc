"""How the size report charges bytes: rows in the order declared, and claims on
a region's bytes, each byte to exactly one row.

A file can declare a million constants or segments in a few megabytes, and a
row is hundreds of bytes: past `MAX_ROWS` rows, new ones are summed into one
row per kind ("... rows past the first N"), so the report's size follows
what a reader can use, while every byte is still charged somewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from exirc.inspector.size_rows import SizeRow

RowKey = tuple[Any, ...]
Claim = tuple[int, int, RowKey]  # [start, end) in the file, and the row it goes to
Fill = Callable[[int, int], None]  # charges the bytes [start, end) of a region

MAX_ROWS = 10_000
MORE_GROUP = "more rows"


class Ledger:
    """Rows in the order they are declared, and the bytes charged to each."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        self.rows: dict[RowKey, SizeRow] = {}
        self.max_rows = max_rows

    @property
    def full(self) -> bool:
        """Whether new rows are summed into the rows past the cap."""
        return len(self.rows) >= self.max_rows

    def declare(self, key: RowKey, group: str, item: str, kind: str,
                **detail: Any) -> RowKey:
        if key in self.rows:
            return key
        if self.full:
            return self.overflow(kind)
        self.rows[key] = SizeRow(group, item, kind, 0, detail)
        return key

    def overflow(self, kind: str) -> RowKey:
        """The row summing rows of `kind` declared past the cap."""
        key = ("more", kind)
        if key not in self.rows:
            self.rows[key] = SizeRow(MORE_GROUP, f"{kind} rows past the first {self.max_rows}, "
                                     "summed", kind, 0, {"summed": True})
        return key

    def lookup(self, key: RowKey, kind: str) -> RowKey:
        """`key` if declared, else the row it was summed into."""
        return key if key in self.rows else self.overflow(kind)

    def charge(self, key: RowKey, nbytes: int) -> None:
        self.rows[key].nbytes += nbytes

    def fill(self, key: RowKey) -> Fill:
        """A region charged entirely to one row."""
        return lambda start, end: self.charge(key, end - start)

    def fill_claims(self, claims: Callable[[], Iterable[Claim]], rest: RowKey) -> Fill:
        """A region charged to the claims `claims()` makes (sorted by start), the
        slack to `rest`."""
        return lambda start, end: _charge_claims(self, start, end, claims(), rest)


def _charge_claims(ledger: Ledger, start: int, end: int, claims: Iterable[Claim],
                   rest: RowKey) -> None:
    """Each byte of [start, end) to the first claim covering it; the bytes no
    claim covers to `rest`."""
    owned = 0
    cursor = start
    for claim_start, claim_end, key in claims:
        if claim_start >= end:
            break
        lo, hi = max(claim_start, cursor), min(claim_end, end)
        if hi > lo:
            ledger.charge(key, hi - lo)
            owned += hi - lo
            cursor = hi
    if end - start > owned:
        ledger.charge(rest, end - start - owned)
