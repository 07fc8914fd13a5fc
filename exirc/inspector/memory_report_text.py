"""The memory report as text: per method, each arena's size, peak and largest tensors."""

from __future__ import annotations

from exirc.inspector.memory_report import (
    MAX_WARNINGS,
    ArenaReport,
    MethodMemory,
    block_names,
    span_text,
)
from exirc.inspector.render import Style, clean, compact_bytes, plural
from exirc.serialize import program as P

# Arenas a method's text shows; the rest are counted (`--json` has them all).
MAX_ARENAS = 16


def render_memory(reports: list[MethodMemory], bold: Style) -> str:
    lines: list[str] = []
    for report in reports:
        if lines:
            lines.append("")
        lines.extend(_render_method(report, bold))
    return "\n".join(lines)


def _render_method(report: MethodMemory, bold: Style) -> list[str]:
    lines = [bold(f"memory of method {clean(report.name)}: ") +
             f"{plural(report.instruction_count, 'instruction')}, "
             f"{plural(report.planned_tensors, 'planned tensor')} in "
             f"{plural(len(report.arenas), 'arena')}"
             + (f", {plural(len(report.loops), 'loop')}" if report.loops else "")]
    if not report.arenas:
        lines.append("  no planned memory")
    for shown, arena in enumerate(report.arenas):
        if shown == MAX_ARENAS:
            lines.append(f"  ... {len(report.arenas) - MAX_ARENAS} more arenas (see --json)")
            break
        lines.extend(_render_arena(arena))
    if report.lifetimes_approximate:
        lines.append("  note: loops cross each other in too many ways to follow exactly; "
                     "lifetimes cover whole loop regions, so live bytes may be overstated")
    if report.warning_count:
        more = "" if report.warnings_complete else \
            " (the check stopped early: too many overlapping regions to compare them all)"
        lines.append(f"  warnings ({report.warning_count}{more}):")
        lines.extend(f"    {clean(w.message)}" for w in report.warnings[:MAX_WARNINGS])
        if report.warning_count > MAX_WARNINGS:
            lines.append(f"    ... {report.warning_count - MAX_WARNINGS} more")
    elif not report.warnings_complete:
        lines.append("  note: the check for overlapping regions stopped early (too many "
                     "overlapping regions to compare them all)")
    return lines


def _render_arena(arena: ArenaReport) -> list[str]:
    indent = " " * 19  # continuation lines line up with the figures
    shared = " (shared by every method, kept from run to run: program state)" \
        if arena.memory_id >= P.FIRST_SHARED_BUFFER else ""
    lines = [f"  arena {arena.memory_id}: {plural(arena.tensor_count, 'planned tensor')}{shared}",
             f"    size           {compact_bytes(arena.size)}"]
    if arena.peak_position is None:
        lines.append("    peak live      0 B (nothing is ever live)")
        return lines
    share = f"{100 * arena.peak_bytes / arena.size:.1f}% of the arena" if arena.size else ""
    lines.append(f"    peak live      {compact_bytes(arena.peak_bytes)} ({share})")
    site = arena.peak_site
    if site is None:
        lines.append(f"{indent}before any instruction (the method has none)")
    else:
        chain = f" of chain {site.chain}" if site.chain else ""
        lines.append(f"{indent}at instruction {site.index}{chain}: {clean(site.text)}")
        if site.source and site.source.get("file"):
            code = f": {site.source['code']}" if site.source.get("code") else ""
            lines.append(f"{indent}{clean(site.source['file'])}:{site.source['line']}"
                         f"{clean(code)}")
        if site.module:
            lines.append(f"{indent}in module {clean(site.module)}")
    lines.append(f"    fragmentation  {100 * arena.fragmentation:.1f}% "
                 f"({compact_bytes(arena.wasted_bytes)} more than the peak needs)")
    lines.append("    largest tensors live at the peak:")
    header = ("value", "type", "bytes", "offset", "live at")
    rows = [header] + [
        (block_names(b), clean(b.tensors[0].type), compact_bytes(b.nbytes), str(b.offset),
         ", ".join(span_text(s) for s in b.live))
        for b in arena.largest_at_peak]
    widths = [max(len(row[k]) for row in rows) for k in range(len(header))]
    for row in rows:
        lines.append("      " + "  ".join([
            row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2]),
            row[3].rjust(widths[3]), row[4]]))
    return lines
