"""`compile --explain-delegation`: what went to a backend, what did not, and why."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from exirc.inspector.render import human_bytes

if TYPE_CHECKING:  # the report module imports torch; the CLI starts without it
    from exirc.backend.delegation.report import DelegationReport

_SHOWN_SOURCES = 4


def _counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{name} ×{count}" if count > 1 else name
                     for name, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


def explain_text(reports: Mapping[str, DelegationReport]) -> str:
    if not reports:
        return "no delegation: the pipeline has no delegate pass (try --target xnnpack)\n"
    lines = []
    for method, report in reports.items():
        backends = sorted({p.backend_id for p in report.partitions})
        lines.append(f"method {method}: {report.delegated_nodes} of {report.compute_nodes} "
                     f"nodes delegated in {len(report.partitions)} partition"
                     f"{'s' if len(report.partitions) != 1 else ''}"
                     + (f" ({', '.join(backends)})" if backends else "")
                     + f", partitioner {report.partitioner}")
        for p in report.partitions:
            made = f" -> {p.backend_nodes} backend nodes" if p.backend_nodes is not None else ""
            lines.append(f"  {p.delegate}: {sum(p.ops.values())} nodes{made}, payload "
                         f"{human_bytes(p.payload_bytes)}, weights {human_bytes(p.weight_bytes)}")
            lines.append(f"    ops: {_counts(p.ops)}")
            if p.backend_ops:
                lines.append(f"    backend ops: {_counts(p.backend_ops)}")
            if p.sources:
                more = len(p.sources) - _SHOWN_SOURCES
                lines.append("    from: " + ", ".join(p.sources[:_SHOWN_SOURCES])
                             + (f" (+{more} more lines)" if more > 0 else ""))
        if report.left_out:
            lines.append(f"  left on the interpreter ({len(report.left_out)}):")
            for x in report.left_out:
                where = f"  at {x.source}" if x.source else ""
                lines.append(f"    %{x.node} {x.op} [{x.category}] {x.reason}{where}")
        else:
            lines.append("  every compute node was delegated")
    return "\n".join(lines) + "\n"


def explain_json(reports: Mapping[str, DelegationReport]) -> str:
    document: dict[str, Any] = {"version": 1, "methods": {
        method: report.to_json() for method, report in reports.items()}}
    return json.dumps(document, indent=2) + "\n"


def summary_line(reports: Mapping[str, DelegationReport]) -> str | None:
    """One line for the compile summary, or None when nothing was delegated."""
    partitions = sum(len(r.partitions) for r in reports.values())
    if not partitions:
        return None
    delegated = sum(r.delegated_nodes for r in reports.values())
    total = sum(r.compute_nodes for r in reports.values())
    weights = sum(p.weight_bytes for r in reports.values() for p in r.partitions)
    return (f"  delegated {delegated} of {total} nodes in {partitions} partition"
            f"{'s' if partitions != 1 else ''} (weights {human_bytes(weights)}); "
            "--explain-delegation says why the rest was not")
