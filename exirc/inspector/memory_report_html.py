"""The memory plan as a picture: one self-contained HTML page.

Per method and arena, an inline SVG timeline: x is the instruction
position, y the offset in the arena, one box per planned tensor spanning its
lifetime and its bytes, with a tooltip (an SVG `<title>`) naming it. A dashed
line marks the peak and a shaded band each loop. No scripts, no external resources: the page opens
anywhere, offline, and can be attached to a bug report as is.
"""

from __future__ import annotations

import html
import itertools

from exirc.inspector.memory_report import ArenaReport, MethodMemory, PlannedTensor
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

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 2em; }
svg { width: 100%; max-width: 1100px; background: #fafafa; border: 1px solid #ddd; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.tensor { fill-opacity: 0.75; stroke: #333; stroke-width: 0.5; }
.tensor:hover { fill-opacity: 1; stroke-width: 1.5; }
.unused { fill: none; stroke: #999; stroke-dasharray: 4 3; }
.frame { fill: none; stroke: #888; }
.tick { stroke: #ccc; }
.loop { fill: #36c; fill-opacity: 0.07; stroke: none; }
.peak { stroke: #c00; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg text.peak-label { fill: #c00; }
.warning { color: #a00; }
"""


def memory_plan_html(reports: list[MethodMemory], *, title: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>memory plan: {_esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>memory plan of {_esc(title)}</h1>",
        "<p>x: instruction position (chains one after another); y: offset in the arena; "
        "one box per planned tensor over its lifetime. Hover a box for details.</p>",
    ]
    for report in reports:
        parts.append(f"<h2>method {_esc(report.name)}</h2>")
        if not report.arenas:
            parts.append("<p>no planned memory</p>")
        for shown, arena in enumerate(report.arenas):
            if shown == MAX_ARENAS:
                parts.append(f"<p>{len(report.arenas) - MAX_ARENAS} more arenas not drawn "
                             "(exirc inspect --show memory --json has them)</p>")
                break
            parts.append(_arena_summary(arena))
            parts.append(arena_svg(report, arena))
        for warning in report.warnings:
            parts.append(f'<p class="warning">warning: {_esc(warning.message)}</p>')
        if report.warning_count > len(report.warnings):
            parts.append(f'<p class="warning">... {report.warning_count - len(report.warnings)}'
                         " more warnings</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _arena_summary(arena: ArenaReport) -> str:
    text = (f"arena {arena.memory_id}: {compact_bytes(arena.size)}, "
            f"{arena.tensor_count} planned tensors, peak {compact_bytes(arena.peak_bytes)}")
    if arena.tensor_count > MAX_BOXES:
        text += f" (the first {MAX_BOXES} drawn)"
    if arena.peak_position is not None:
        text += (f" at position {arena.peak_position}, fragmentation "
                 f"{100 * arena.fragmentation:.1f}%")
    return f"<p>{_esc(text)}</p>"


def arena_svg(report: MethodMemory, arena: ArenaReport) -> str:
    positions = max(report.instruction_count, 1)
    dx = WIDTH / positions
    # Scale to the arena, or to the furthest tensor end if a (broken) plan
    # puts one past it, so every box is on the picture.
    drawn = list(itertools.islice(arena.tensors, MAX_BOXES))
    extent = max([arena.size, 1, *(t.offset + t.nbytes for t in drawn)])
    dy = HEIGHT / extent
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" '
           f'viewBox="0 0 {LEFT + WIDTH + RIGHT} {TOP + HEIGHT + BOTTOM}">']
    out.extend(_axes(positions, dx, extent))
    for first, last in report.loops[:MAX_LOOPS]:
        # A band (a path, so that rects stay one per tensor) behind the boxes.
        out.append(f'<path class="loop" d="M{LEFT + first * dx:.2f} {TOP}'
                   f'h{(last - first + 1) * dx:.2f}v{HEIGHT}h{-(last - first + 1) * dx:.2f}z">'
                   f'<title>loop: positions {first}..{last}</title></path>')
    for tensor in drawn:
        out.append(_tensor_rect(tensor, dx, dy, positions))
    if arena.peak_position is not None:
        x = LEFT + (arena.peak_position + 0.5) * dx
        out.append(f'<line class="peak" x1="{x:.2f}" y1="{TOP}" x2="{x:.2f}" '
                   f'y2="{TOP + HEIGHT}"><title>peak: {arena.peak_bytes} bytes live at '
                   f'position {arena.peak_position}</title></line>')
        anchor = "end" if arena.peak_position > positions / 2 else "start"
        shift = -4 if anchor == "end" else 4
        out.append(f'<text class="peak-label" x="{x + shift:.2f}" y="{TOP - 8}" '
                   f'text-anchor="{anchor}">peak {_esc(human_bytes(arena.peak_bytes))} at '
                   f'{arena.peak_position}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _axes(positions: int, dx: float, extent: int) -> list[str]:
    out = [f'<path class="frame" d="M{LEFT} {TOP}h{WIDTH}v{HEIGHT}h{-WIDTH}z"/>']
    step = max(1, -(-positions // MAX_TICKS))
    for position in range(0, positions, step):
        x = LEFT + (position + 0.5) * dx
        out.append(f'<text x="{x:.2f}" y="{TOP + HEIGHT + 16}" '
                   f'text-anchor="middle">{position}</text>')
    out.append(f'<text x="{LEFT + WIDTH / 2}" y="{TOP + HEIGHT + 34}" '
               'text-anchor="middle">instruction</text>')
    for k in range(5):
        offset = extent * k // 4
        y = TOP + HEIGHT * k / 4
        out.append(f'<line class="tick" x1="{LEFT}" y1="{y:.2f}" x2="{LEFT + WIDTH}" '
                   f'y2="{y:.2f}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.2f}" '
                   f'text-anchor="end">{_esc(human_bytes(offset))}</text>')
    return out


def _tensor_rect(tensor: PlannedTensor, dx: float, dy: float, positions: int) -> str:
    y = TOP + tensor.offset * dy
    height = max(tensor.nbytes * dy, 1.0)  # zero-byte tensors stay visible
    if tensor.lifetime is None:
        # Planned but used by no instruction: outlined across the whole run.
        x, width, css = float(LEFT), positions * dx, 'class="unused"'
        live = "used by no instruction"
    else:
        first, last = tensor.lifetime
        x, width = LEFT + first * dx, (last - first + 1) * dx
        css = f'class="tensor" style="fill: hsl({tensor.value * 47 % 360}, 65%, 60%)"'
        live = f"live at instructions {first}..{last}" if last > first \
            else f"live at instruction {first}"
    tip = (f"%{tensor.value}: {tensor.type}, {tensor.nbytes} bytes at offset "
           f"{tensor.offset}, {live}")
    return (f'<rect {css} x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" '
            f'height="{height:.2f}"><title>{_esc(tip)}</title></rect>')


def _esc(text: str) -> str:
    return html.escape(text, quote=True)
