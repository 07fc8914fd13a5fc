"""`exirc compile`'s memory line, from the same report as `exirc inspect
--show memory` (`exirc.inspector.memory_report`), so the two always agree:
each method's working arena, its peak live bytes and its fragmentation,
computed from the program as written.

The planner's own figures (`CompileReport.arena_bytes`, its lower bound)
are per-arena sums over methods; the line shows each method, as inspect
does, because methods never run at the same time.
"""

from __future__ import annotations

from typing import Any

from exirc.inspector.render import compact_bytes
from exirc.serialize import program as P


def working_arenas(program: P.Program) -> list[dict[str, Any]]:
    """Each method's non-shared arenas: method, arena id, size, peak live
    bytes and fragmentation (the share of the arena the peak does not need)."""
    from exirc.inspector.memory_report import memory_report

    found = []
    for method in memory_report(program):
        for arena in method.arenas:
            if arena.memory_id >= P.FIRST_SHARED_BUFFER:
                continue  # program state: reported as state
            found.append({"method": method.name, "arena": arena.memory_id,
                          "bytes": arena.size, "peak_live_bytes": arena.peak_bytes,
                          "fragmentation": arena.fragmentation})
    return found


def memory_text(arenas: list[dict[str, Any]]) -> str:
    """`arena 8.0 KiB (8,240 B), peak live 8,212 B, fragmentation 0.3%`, with
    the method (and arena id, when a method has several) when there are more."""
    if not arenas:
        return "no planned memory"
    parts = []
    for arena in arenas:
        where = ""
        if len(arenas) > 1:
            same_method = sum(a["method"] == arena["method"] for a in arenas)
            where = f"{arena['method']}" + (f" #{arena['arena']}" if same_method > 1 else "")
            where += ": "
        parts.append(f"{where}arena {compact_bytes(arena['bytes'])}, peak live "
                     f"{compact_bytes(arena['peak_live_bytes'])}, fragmentation "
                     f"{100 * arena['fragmentation']:.1f}%")
    return "; ".join(parts)
