"""The size report as text: a table of rows per region of the file, and the
bytes stored twice.
"""

from __future__ import annotations

import heapq

from exirc.inspector.render import Style, clean, compact_bytes, human_bytes, plural
from exirc.inspector.size_rows import SizeReport, SizeRow

# Constant rows listed per group in the text view; the rest are summed.
MAX_CONSTANT_ROWS = 8
# The copies named per group of duplicates in the text view.
MAX_COPIES_SHOWN = 4
# The rows of stored tensors: a model has many, so they are cut as above.
STORED_KINDS = ("constant", "mutable_data", "delegate_weight")


def render_size(report: SizeReport, bold: Style, *, path: str | None = None) -> str:
    total = max(report.file_size, 1)
    name = clean(path or "<bytes>")
    # (label, bytes, note after the figures, is a heading)
    table: list[tuple[str, int, str, bool]] = []
    for group, rows in _groups(report.rows):
        table.append((clean(group), sum(r.nbytes for r in rows), "", True))
        table.extend(("  " + clean(label), nbytes, note, False)
                     for label, nbytes, note in _shown_rows(rows))
    table.append(("total", sum(r.nbytes for r in report.rows), "", True))
    width = min(max(len(label) for label, _, _, _ in table), 60)
    lines = [bold(f"size of {name}: ") + compact_bytes(report.file_size)]
    for label, nbytes, note, heading in table:
        if len(label) > width:
            label = label[:width - 3] + "..."
        text = f"  {label:<{width}}  {_size_columns(nbytes)}  {100 * nbytes / total:5.1f}%"
        text = bold(text) if heading else text
        lines.append(f"{text}  {note}" if note else text)
    lines.append(_render_duplicates(report))
    return "\n".join(lines)


def _size_columns(nbytes: int) -> str:
    """The human size, and the exact count when the human form rounds."""
    exact = f"({nbytes:,} B)" if nbytes >= 1024 else ""
    return f"{human_bytes(nbytes):>9} {exact:>13}"


def _groups(rows: list[SizeRow]) -> list[tuple[str, list[SizeRow]]]:
    groups: dict[str, list[SizeRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    return list(groups.items())


def _shown_rows(rows: list[SizeRow]) -> list[tuple[str, int, str]]:
    """(label, bytes, note) of a group's rows as listed: stored buffers
    largest first and cut to one screen, the others in file order."""
    stored = [r for r in rows if r.kind in STORED_KINDS]
    shown = {id(r) for r in heapq.nsmallest(MAX_CONSTANT_ROWS, stored, key=lambda r: -r.nbytes)}
    rest = [r for r in stored if id(r) not in shown]
    hidden = {id(r) for r in rest}
    out = [(row.item, row.nbytes, _note(row)) for row in rows if id(row) not in hidden]
    if rest:
        out.append((f"... {plural(len(rest), 'more buffer')} (see --json)",
                    sum(r.nbytes for r in rest), ""))
    return out


def _note(row: SizeRow) -> str:
    if "duplicate_of" in row.detail:
        return f"duplicate of {row.detail['duplicate_of']}"
    if "same_bytes_as" in row.detail:
        return f"same bytes as {row.detail['same_bytes_as']}"
    if row.detail.get("shared_with"):  # a weight other delegates (or named data) read too
        return f"shared with {', '.join(row.detail['shared_with'])}"
    return ""


def _render_duplicates(report: SizeReport) -> str:
    """`duplicate bytes: 24 B in 1 tensor: constant 1, constant 2 (24 B each); ...`"""
    if not report.duplicates:
        return "duplicate bytes: none"
    parts = []
    for d in report.duplicates[:MAX_CONSTANT_ROWS]:
        shown = d.tensors[:MAX_COPIES_SHOWN]
        if d.copies > len(shown):
            shown = [*shown, f"{d.copies - len(shown)} more"]
        parts.append(f"{', '.join(shown)} ({human_bytes(d.nbytes)} each)")
    more = len(report.duplicates) - MAX_CONSTANT_ROWS
    if more > 0:
        parts.append(f"{more} more")
    return (f"duplicate bytes: {compact_bytes(report.duplicate_bytes)} in "
            f"{plural(report.duplicate_tensors, 'tensor')}: {'; '.join(parts)}; "
            f"storing each once would save {compact_bytes(report.duplicate_bytes)}")
