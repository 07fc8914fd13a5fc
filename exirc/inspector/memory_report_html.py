"""The memory plan as a picture: one self-contained HTML page.

Per method and arena, an inline SVG timeline: x is the instruction
position, y the offset in the arena, one box per planned tensor spanning its
lifetime and its bytes, with a tooltip (an SVG `<title>`) naming it, the
instruction where its life starts and that instruction's source line. A
dashed line marks the peak and a shaded band each loop; a table lists the
largest tensors live at the peak. The inline script (`memory_report_page`)
adds a log scale and zoom; without it the page still shows everything. No
external resources: the page opens anywhere, offline, and can be attached to
a bug report as is.
"""

from __future__ import annotations

import html
import itertools

from exirc.inspector.memory_report import ArenaReport, MethodMemory, PlannedTensor, block_names
from exirc.inspector.memory_report_page import SCRIPT, STYLE
from exirc.inspector.render import compact_bytes, human_bytes

# Plot geometry in SVG user units; the SVG scales to the page width.
WIDTH = 960
HEIGHT = 320
LEFT = 90
TOP = 24
BOTTOM = 40
RIGHT = 16
MAX_TICKS = 10
# What one page draws at most, so that its size follows what a reader can
# look at, not what a file can declare: arenas per method, boxes per arena,
# loop bands per arena. What is left out is counted on the page.
MAX_ARENAS = 32
MAX_BOXES = 5_000
MAX_LOOPS = 200
# An instruction's text in a tooltip or table, at most (a call can list
# hundreds of arguments).
MAX_SITE_TEXT = 160



def memory_plan_html(reports: list[MethodMemory], *, title: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>memory plan: {_esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>memory plan of {_esc(title)}</h1>",
        "<p>x: instruction position (chains one after another); y: offset in the arena; "
        "one box per planned tensor over its lifetime. Hover a box for details; drag over "
        "a plot to zoom, double-click to reset; the log scale shows small tensors beside "
        "a huge one.</p>",
    ]
    figures = itertools.count()
    for report in reports:
        parts.append(f"<h2>method {_esc(report.name)}</h2>")
        if not report.arenas:
            parts.append("<p>no planned memory</p>")
        for shown, arena in enumerate(report.arenas):
            if shown == MAX_ARENAS:
                parts.append(f"<p>{len(report.arenas) - MAX_ARENAS} more arenas not drawn "
                             "(exirc inspect --show memory --json has them)</p>")
                break
            parts.append(_arena_summary(arena, report))
            parts.append('<div class="arena-plot">')
            parts.append(CONTROLS)
            parts.append(arena_svg(report, arena, figure=next(figures)))
            parts.append("</div>")
            parts.append(largest_at_peak_table(report, arena))
        for warning in report.warnings:
            parts.append(f'<p class="warning">warning: {_esc(warning.message)}</p>')
        if report.warning_count > len(report.warnings):
            parts.append(f'<p class="warning">... {report.warning_count - len(report.warnings)}'
                         " more warnings</p>")
    parts.append(f"<script>{SCRIPT}</script>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# Shown by the script (hidden without it: they would do nothing).
CONTROLS = ('<div class="controls" hidden><label><input type="checkbox" class="log-scale"> '
            "log scale</label>"
            '<button type="button" class="reset-zoom">reset zoom</button>'
            '<span class="hint">drag over the plot to zoom</span></div>')


def _arena_summary(arena: ArenaReport, report: MethodMemory) -> str:
    text = (f"arena {arena.memory_id}: {compact_bytes(arena.size)}, "
            f"{arena.tensor_count} planned tensors, peak {compact_bytes(arena.peak_bytes)}")
    if arena.tensor_count > MAX_BOXES:
        text += f" (the first {MAX_BOXES} drawn)"
    if arena.peak_position is not None:
        text += (f" at position {arena.peak_position}, fragmentation "
                 f"{100 * arena.fragmentation:.1f}%")
        peak = _site_text(report, arena.peak_position)
        if peak:
            text += f"; the peak instruction: {peak}"
    return f"<p>{_esc(text)}</p>"


def largest_at_peak_table(report: MethodMemory, arena: ArenaReport) -> str:
    """The largest tensors live at the peak, each with where its life starts."""
    if not arena.largest_at_peak:
        return ""
    rows = ["<table class=\"largest\"><caption>largest at the peak "
            f"(position {arena.peak_position})</caption>",
            "<tr><th>values</th><th>type</th><th>bytes</th><th>offset</th><th>live</th>"
            "<th>first instruction</th></tr>"]
    for block in arena.largest_at_peak:
        first = block.tensors[0]
        live = ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in block.live)
        site = _site_text(report, first.lifetime[0]) if first.lifetime else ""
        rows.append(f"<tr><td>{_esc(block_names(block))}</td><td>{_esc(first.type)}</td>"
                    f'<td class="bytes">{_esc(human_bytes(block.nbytes))}</td>'
                    f"<td>{block.offset}</td><td>{_esc(live)}</td>"
                    f"<td><code>{_esc(site)}</code></td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _site_text(report: MethodMemory, position: int) -> str:
    """`5: aten::add.out(...) at model.py:12 (forward)`, or "" past the instructions."""
    site = report.site(position)
    if site is None:
        return ""
    text = site.text if len(site.text) <= MAX_SITE_TEXT else site.text[:MAX_SITE_TEXT] + "..."
    source = site.source
    if source is not None:
        text += f" at {source['file']}:{source['line']}"
        if source.get("function"):
            text += f" ({source['function']})"
    if site.module:
        text += f" [module {site.module}]"
    return f"{position}: {text}"


def arena_svg(report: MethodMemory, arena: ArenaReport, *, figure: int = 0) -> str:
    """One arena's timeline; `figure` numbers it on the page (its clip path's id)."""
    positions = max(report.instruction_count, 1)
    dx = WIDTH / positions
    # Scale to the arena, or to the furthest tensor end if a (broken) plan
    # puts one past it, so every box is on the picture.
    drawn = list(itertools.islice(arena.tensors, MAX_BOXES))
    extent = max([arena.size, 1, *(t.offset + t.nbytes for t in drawn)])
    dy = HEIGHT / extent
    clip = f"plot-{figure}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" '
           f'viewBox="0 0 {LEFT + WIDTH + RIGHT} {TOP + HEIGHT + BOTTOM}" '
           f'data-plot="{LEFT} {TOP} {WIDTH} {HEIGHT}" data-positions="{positions}" '
           f'data-extent="{extent}">',
           f'<clipPath id="{clip}"><path d="M{LEFT} {TOP}h{WIDTH}v{HEIGHT}h{-WIDTH}z"/>'
           "</clipPath>"]
    out.extend(_axes(positions, dx, extent))
    out.append(f'<g clip-path="url(#{clip})">')
    for first, last in report.loops[:MAX_LOOPS]:
        # A band (a path, so that rects stay one per tensor) behind the boxes.
        out.append(f'<path class="loop" data-first="{first}" data-last="{last}" '
                   f'd="M{LEFT + first * dx:.2f} {TOP}'
                   f'h{(last - first + 1) * dx:.2f}v{HEIGHT}h{-(last - first + 1) * dx:.2f}z">'
                   f'<title>loop: positions {first}..{last}</title></path>')
    sites: dict[int, str] = {}  # position -> its instruction's text, made once
    for tensor in drawn:
        out.append(_tensor_rect(tensor, dx, dy, positions, report, sites))
    if arena.peak_position is not None:
        x = LEFT + (arena.peak_position + 0.5) * dx
        out.append(f'<line class="peak" data-position="{arena.peak_position}" x1="{x:.2f}" '
                   f'y1="{TOP}" x2="{x:.2f}" y2="{TOP + HEIGHT}"><title>peak: '
                   f'{arena.peak_bytes} bytes live at position {arena.peak_position}</title>'
                   "</line>")
    out.append("</g>")
    if arena.peak_position is not None:
        anchor = "end" if arena.peak_position > positions / 2 else "start"
        shift = -4 if anchor == "end" else 4
        out.append(f'<text class="peak-label" data-position="{arena.peak_position}" '
                   f'x="{x + shift:.2f}" y="{TOP - 8}" '
                   f'text-anchor="{anchor}">peak {_esc(human_bytes(arena.peak_bytes))} at '
                   f'{arena.peak_position}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _axes(positions: int, dx: float, extent: int) -> list[str]:
    # The ticks are in a group of their own: the script redraws them on zoom.
    out = [f'<path class="frame" d="M{LEFT} {TOP}h{WIDTH}v{HEIGHT}h{-WIDTH}z"/>',
           f'<text x="{LEFT + WIDTH / 2}" y="{TOP + HEIGHT + 34}" '
           'text-anchor="middle">instruction</text>', '<g class="axis">']
    step = max(1, -(-positions // MAX_TICKS))
    for position in range(0, positions, step):
        x = LEFT + (position + 0.5) * dx
        out.append(f'<text x="{x:.2f}" y="{TOP + HEIGHT + 16}" '
                   f'text-anchor="middle">{position}</text>')
    for k in range(5):
        offset = extent * k // 4
        y = TOP + HEIGHT * k / 4
        out.append(f'<line class="tick" x1="{LEFT}" y1="{y:.2f}" x2="{LEFT + WIDTH}" '
                   f'y2="{y:.2f}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.2f}" '
                   f'text-anchor="end">{_esc(human_bytes(offset))}</text>')
    out.append("</g>")
    return out


def _tensor_rect(tensor: PlannedTensor, dx: float, dy: float, positions: int,
                 report: MethodMemory, sites: dict[int, str]) -> str:
    y = TOP + tensor.offset * dy
    height = max(tensor.nbytes * dy, 1.0)  # zero-byte tensors stay visible
    if tensor.lifetime is None:
        # Planned but used by no instruction: outlined across the whole run.
        first, last = 0, positions - 1
        css = 'class="unused"'
        live = "used by no instruction"
    else:
        first, last = tensor.lifetime
        css = f'class="tensor" style="fill: hsl({tensor.value * 47 % 360}, 65%, 60%)"'
        live = f"live at instructions {first}..{last}" if last > first \
            else f"live at instruction {first}"
    x, width = LEFT + first * dx, (last - first + 1) * dx
    tip = (f"%{tensor.value}: {tensor.type}, {tensor.nbytes} bytes at offset "
           f"{tensor.offset}, {live}")
    if tensor.lifetime is not None:
        if first not in sites:
            sites[first] = _site_text(report, first)
        if sites[first]:
            tip += f"\nfirst at {sites[first]}"
    return (f'<rect {css} data-offset="{tensor.offset}" data-bytes="{tensor.nbytes}" '
            f'data-first="{first}" data-last="{last}" x="{x:.2f}" y="{y:.2f}" '
            f'width="{width:.2f}" height="{height:.2f}"><title>{_esc(tip)}</title></rect>')


def _esc(text: str) -> str:
    return html.escape(text, quote=True)
