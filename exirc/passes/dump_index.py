"""The index of a pass dump directory (`--dump-dir`): index.txt and index.html.

Besides the table of passes, the index names the directory's other files: each
method's graph as captured (before the first pass) and, once the compile has
finished, the memory plan page and the final program's listing.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from exirc.passes.record import PassRecord


@dataclass(frozen=True)
class DumpFile:
    """A file of the dump directory other than a pass's dump or diff."""
    label: str  # what a reader looks for: "forward: captured graph (ATen dialect)"
    name: str  # inside the directory

_INDEX_COLUMNS = ("#", "method", "stage", "pass", "nodes before", "nodes after", "changed",
                  "graph", "ms", "dump", "diff")


def _index_rows(records: list[PassRecord]) -> list[tuple[str, ...]]:
    def graph(r: PassRecord) -> str:
        return "?" if r.graph_changed is None else "differs" if r.graph_changed else "same"

    return [(f"{i:02d}", r.method, r.stage, r.name, str(r.nodes_before), str(r.nodes),
             "yes" if r.changed else "no", graph(r), f"{r.seconds * 1e3:.2f}",
             r.dump_file or "-", r.diff_file or "-")
            for i, r in enumerate(records, start=1)]


def _misreport_note(records: list[PassRecord]) -> str:
    wrong = [r.label for r in records if r.misreported]
    return ("passes that changed the graph but said they did not: " + ", ".join(wrong)
            if wrong else "")


def index_text(records: list[PassRecord], files: Sequence[DumpFile] = ()) -> str:
    """index.txt: the other `files` (a comment line each), then a table of every
    pass in order (one row a pass, columns space-aligned)."""
    rows = [_INDEX_COLUMNS, *_index_rows(records)]
    numeric = {"#", "nodes before", "nodes after", "ms"}
    widths = [max(len(row[i]) for row in rows) for i in range(len(_INDEX_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) if column in numeric else cell.ljust(w)
                       for cell, w, column in zip(row, widths, _INDEX_COLUMNS)).rstrip()
             for row in rows]
    note = _misreport_note(records)
    return "\n".join([*(f"# {f.label}: {f.name}" for f in files),
                      f"# exirc pass dump: {len(records)} passes; 'changed' is what a pass "
                      "says, 'graph' whether its graph text differs", *lines,
                      *([f"# warning: {note}"] if note else [])]) + "\n"


_STYLE = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
          "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}"
          "td.n{text-align:right;font-family:monospace}tr.same td{color:#888}"
          "tr.misreported td{background:#fdd}")


def index_html(records: list[PassRecord], files: Sequence[DumpFile] = ()) -> str:
    """index.html: the same table, self-contained (inline CSS, no scripts), with
    links: a pass's diff links its coloured page, and the other `files` are
    listed above the table."""
    header = "".join(f"<th>{html.escape(c)}</th>" for c in _INDEX_COLUMNS)
    body = []
    for record, row in zip(records, _index_rows(records)):
        cells = []
        for column, value in zip(_INDEX_COLUMNS, row):
            text = html.escape(value)
            if column == "dump" and value != "-":
                text = f'<a href="{html.escape(value, quote=True)}">{column}</a>'
            elif column == "diff" and record.diff_page is not None:
                text = f'<a href="{html.escape(record.diff_page, quote=True)}">{column}</a>'
            numeric = column in ("#", "nodes before", "nodes after", "ms")
            cells.append(f'<td class="n">{text}</td>' if numeric else f"<td>{text}</td>")
        kind = ("misreported" if record.misreported
                else "same" if record.graph_changed is False else "changed")
        body.append(f'<tr class="{kind}">{"".join(cells)}</tr>')
    note = _misreport_note(records)
    listed = "".join(f'<li>{html.escape(f.label)}: <a href="{html.escape(f.name, quote=True)}">'
                     f"{html.escape(f.name)}</a></li>" for f in files)
    warning = f"<p><strong>warning:</strong> {html.escape(note)}</p>" if note else ""
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>exirc pass dump"
            f"</title><style>{_STYLE}</style></head><body>\n<h1>exirc pass dump: "
            f"{len(records)} passes</h1>\n<p><em>changed</em> is what a pass says; "
            "<em>graph</em> whether its graph text differs.</p>\n"
            f"{f'<ul>{listed}</ul>' if listed else ''}\n"
            f"{warning}<table>\n<tr>{header}</tr>\n" + "\n".join(body) +
            "\n</table></body></html>\n")
