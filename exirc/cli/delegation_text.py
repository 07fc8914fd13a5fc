"""`compile --explain-delegation`: what went to a backend, what did not, and why."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from exirc.inspector.render import human_bytes

if TYPE_CHECKING:  # the report module imports torch; the CLI starts without it
    from exirc.backend.delegation.report import DelegationReport, LeftOut

_SHOWN_SOURCES = 4  # source lines of a partition (full listing)
_SHOWN_PLACES = 2   # file:line places of a group of nodes left out


def _counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{name} ×{count}" if count > 1 else name
                     for name, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


def explain_text(reports: Mapping[str, DelegationReport], *, full: bool = False) -> str:
    """`--explain-delegation`: per method, what was delegated and, one line per
    (reason, op), what was left out, with counts; methods that read the same
    (one graph, exported twice: `forward, prefill`) are shown once. `full`
    (`--explain-delegation=full`) lists every partition and every node."""
    if not reports:
        return "no delegation: the pipeline has no delegate pass (try --target xnnpack)\n"
    if full:
        lines = [line for method, report in reports.items()
                 for line in _full_lines(method, report)]
        return "\n".join(lines) + "\n"
    shown: dict[tuple[str, ...], list[str]] = {}  # body -> the methods it is of
    for method, report in reports.items():
        shown.setdefault(tuple(_grouped_lines(report)), []).append(method)
    lines = []
    for body, methods in shown.items():
        lines.append(f"method {', '.join(methods)}: {body[0]}")
        lines.extend(body[1:])
    if any(report.left_out or report.partitions for report in reports.values()):
        lines.append("(--explain-delegation=full lists every partition and every node)")
    return "\n".join(lines) + "\n"


def _heading(report: DelegationReport) -> str:
    backends = sorted({p.backend_id for p in report.partitions})
    return (f"{report.delegated_nodes} of {report.compute_nodes} nodes delegated in "
            f"{len(report.partitions)} partition{'s' if len(report.partitions) != 1 else ''}"
            + (f" ({', '.join(backends)})" if backends else "")
            + f", partitioner {report.partitioner}")


def _grouped_lines(report: DelegationReport) -> list[str]:
    """The heading (without the method), the delegated ops, and a line per
    (reason, op) left out: nothing that differs between two exports of one graph
    (payload bytes do, with the shapes)."""
    lines = [_heading(report)]
    if report.partitions:
        ops: Counter[str] = Counter()
        for p in report.partitions:
            ops.update(p.ops)
        weights = sum(p.weight_bytes for p in report.partitions)
        lines.append(f"  delegated (weights {human_bytes(weights)}): {_counts(ops)}")
    groups: dict[tuple[str, str, str], list[LeftOut]] = {}
    for x in report.left_out:
        groups.setdefault((x.op, x.category, x.reason), []).append(x)
    if groups:
        nodes = len(report.left_out)
        lines.append(f"  left on the interpreter ({nodes} node{'s' if nodes != 1 else ''}, "
                     f"{len(groups)} reason{'s' if len(groups) != 1 else ''}):")
    # Most nodes first; ties in graph order.
    for (op, category, reason), group in sorted(groups.items(), key=lambda g: -len(g[1])):
        count = f" ×{len(group)}" if len(group) > 1 else ""
        lines.append(f"    {op}{count} [{category}] {reason}{_places(group)}")
    if not report.left_out:
        lines.append("  every compute node was delegated")
    return lines


def _places(nodes: list[LeftOut]) -> str:
    """`  at modeling_llama.py:258, executorch.py:571 (+1 more)`: the distinct
    lines of a group's nodes, by file name and line."""
    places = list(dict.fromkeys(_file_line(x.source) for x in nodes if x.source))
    if not places:
        return ""
    more = len(places) - _SHOWN_PLACES
    return ("  at " + ", ".join(places[:_SHOWN_PLACES])
            + (f" (+{more} more)" if more > 0 else ""))


def _file_line(source: str) -> str:
    """`modeling_llama.py:258` of `/.../modeling_llama.py:258: code`."""
    found = re.match(r"(.*?):(\d+)(?::|$)", source)
    return f"{os.path.basename(found.group(1))}:{found.group(2)}" if found else source


def _full_lines(method: str, report: DelegationReport) -> list[str]:
    lines = [f"method {method}: {_heading(report)}"]
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
    return lines


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
    from exirc.backend.delegation.report import unique_weight_bytes

    weights = unique_weight_bytes(reports.values())  # shared by methods: once
    return (f"  delegated {delegated} of {total} nodes in {partitions} partition"
            f"{'s' if partitions != 1 else ''} (weights {human_bytes(weights)}); "
            "--explain-delegation says why the rest was not")


def attention_lines(planned: Mapping[str, Any], *, summary: bool) -> list[str]:
    """What `--target xnnpack-llm` bound of each method's attention
    (`exirc.backend.bind_kv_attention`): one summary line, or per method the count
    and a line per call left decomposed, with why."""
    from exirc.ir.meta import attention_report

    reports = {name: report for name, program in planned.items()
               if (report := attention_report(program.graph_module)) is not None}
    if not reports:
        return []
    if summary:
        bound = sum(len(r.bound) for r in reports.values())
        total = bound + sum(len(r.unbound) for r in reports.values())
        return [f"  attention: {bound} of {total} calls bound to ExecuTorch's llama::update_cache"
                " + llama::custom_sdpa" + ("; --explain-delegation says why the rest was not"
                                           if bound < total else "")]
    return [f"method {name}: {line}" if i == 0 else line
            for name, report in reports.items() for i, line in enumerate(report.lines())]
