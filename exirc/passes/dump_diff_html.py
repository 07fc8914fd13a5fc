"""A pass's unified diff as a self-contained, coloured HTML page (--dump-dir)."""

from __future__ import annotations

import html

_STYLE = ("body{font-family:sans-serif;margin:1.5em}"
          "pre{font-family:monospace;font-size:13px;line-height:1.35}"
          "span{display:block;white-space:pre}"
          ".add{background:#e6ffec}.del{background:#ffebe9}.hunk{color:#6639ba;"
          "background:#f6f1ff}.file{font-weight:bold}")


def _line_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    return "context"


def diff_html(diff: str, *, title: str, index: str = "index.html") -> str:
    """`diff` (unified format) with added lines green, removed red, hunk headers
    violet; no scripts, so the page works from a file:// link or a CI artefact."""
    lines = "".join(f'<span class="{_line_class(line)}">{html.escape(line) or " "}</span>'
                    for line in diff.splitlines())
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            f"<p><a href=\"{html.escape(index, quote=True)}\">index</a></p>\n"
            f"<h1>{html.escape(title)}</h1>\n<pre>{lines}</pre></body></html>\n")
