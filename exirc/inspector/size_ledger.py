"""How the size report charges bytes: rows in the order declared, and claims on
a region's bytes, each byte to exactly one row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exirc.inspector.size_rows import SizeRow

RowKey = tuple[Any, ...]
Claim = tuple[int, int, RowKey]  # [start, end) in the file, and the row it goes to
Fill = Callable[[int, int], None]  # charges the bytes [start, end) of a region


class Ledger:
    """Rows in the order they are declared, and the bytes charged to each."""

    def __init__(self) -> None:
        self.rows: dict[RowKey, SizeRow] = {}

    def declare(self, key: RowKey, group: str, item: str, kind: str,
                **detail: Any) -> RowKey:
        if key not in self.rows:
            self.rows[key] = SizeRow(group, item, kind, 0, detail)
        return key

    def charge(self, key: RowKey, nbytes: int) -> None:
        self.rows[key].nbytes += nbytes

    def fill(self, key: RowKey) -> Fill:
        """A region charged entirely to one row."""
        return lambda start, end: self.charge(key, end - start)

    def fill_claims(self, claims: list[Claim], rest: RowKey) -> Fill:
        """A region charged to `claims` (sorted by start), the slack to `rest`."""
        return lambda start, end: _charge_claims(self, start, end, claims, rest)


def _charge_claims(ledger: Ledger, start: int, end: int, claims: list[Claim],
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
