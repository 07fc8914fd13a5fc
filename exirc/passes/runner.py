"""Running a pipeline on one method: passes, verifiers and instrumentation.

Instrumentation is what a compiler engineer asks for when a pass misbehaves:

    --print-ir-after-all     the graph after every pass
    --print-ir-after-change  the graph after each pass that changed it
    --print-ir-diff          a unified diff of each pass that changed the graph
    --dump-dir DIR           one file per pass, a .diff per changing pass, and
                             index.txt / index.html: passes, node counts, timings
    --time-passes            a table of pass timings

"Changed" means the readable graph text (`print_readable`, which includes the
subgraphs of control-flow ops) differs from the text before the pass. A
pass's own `PassResult.changed` is checked against it: claiming a change that
left the text alone is fine (memory planning only annotates `meta`), but
changing the text while claiming nothing changed is a bug in the pass, and
gets a warning: whatever trusts the claim would miss the change.
"""

from __future__ import annotations

import difflib
import html
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from exirc.errors import ExircError, InternalError, PluginError
from exirc.passes.contract import FunctionPass, Pass, PassResult, pass_label
from exirc.passes.pipeline import STAGES, Pipeline

if TYPE_CHECKING:
    from torch.export import ExportedProgram

Verifier = Callable[["ExportedProgram"], None]


@dataclass
class PassRecord:
    method: str
    stage: str
    name: str
    seconds: float
    changed: bool  # what the pass claims (PassResult.changed)
    nodes: int  # after the pass
    nodes_before: int = 0
    # Whether the graph text differs from before the pass; None when no
    # instrumentation needed the text (it costs a print_readable per pass).
    graph_changed: bool | None = None
    dump_file: str | None = None  # names inside the dump directory
    diff_file: str | None = None

    @property
    def label(self) -> str:
        return f"{self.stage}/{self.name} ({self.method})"

    @property
    def misreported(self) -> bool:
        """The pass changed the graph text but said it changed nothing."""
        return self.graph_changed is True and not self.changed


@dataclass
class Instrumentation:
    print_ir_after_all: bool = False
    dump_dir: Path | None = None
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    records: list[PassRecord] = field(default_factory=list)
    print_ir_after_change: bool = False
    print_ir_diff: bool = False
    # The graph text before the next pass (that is, after the previous one).
    _previous_text: str | None = field(default=None, init=False, repr=False)

    @property
    def prints(self) -> bool:
        return self.print_ir_after_all or self.print_ir_after_change or self.print_ir_diff

    @property
    def needs_text(self) -> bool:
        return self.prints or self.dump_dir is not None

    def begin_method(self, program: ExportedProgram) -> None:
        """Remember the graph before a method's first pass (the first diff's left side)."""
        self._previous_text = graph_text(program) if self.needs_text else None

    def after_pass(self, record: PassRecord, program: ExportedProgram) -> None:
        self.records.append(record)
        if not self.needs_text:
            return
        text = graph_text(program)
        before, self._previous_text = self._previous_text, text
        diff = ""
        if before is not None:
            record.graph_changed = text != before
            if record.graph_changed:
                diff = graph_diff(before, text, record)
        header = f"# after {record.label}"
        if record.misreported and self.prints:
            print(f"warning: pass {record.label} says it changed nothing, but the graph "
                  "differs: fix the `changed` of its PassResult", file=self.stream)
        if self.print_ir_after_all or (self.print_ir_after_change and record.graph_changed):
            print(f"{header}\n{text}", file=self.stream)
        if self.print_ir_diff and diff:
            print(diff, file=self.stream)
        if self.dump_dir is not None:
            self._dump(record, f"{header}\n{text}", diff, self.dump_dir)

    def _dump(self, record: PassRecord, text: str, diff: str, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", record.name)
        stem = f"{record.method}.{len(self.records):02d}.{record.stage}.{safe}"
        record.dump_file = f"{stem}.txt"
        (directory / record.dump_file).write_text(text)
        if diff:
            record.diff_file = f"{stem}.diff"
            (directory / record.diff_file).write_text(diff + "\n")
        # Rewritten after every pass, so a compile that fails part way still
        # leaves an index of the passes that ran.
        (directory / "index.txt").write_text(index_text(self.records))
        (directory / "index.html").write_text(index_html(self.records))

    def timing_table(self) -> str:
        total = sum(r.seconds for r in self.records) or 1e-9
        lines = [f"{'method':<10} {'stage':<8} {'pass':<28} {'ms':>9} {'share':>6} "
                 f"{'nodes':>6} changed"]
        for r in self.records:
            lines.append(f"{r.method:<10} {r.stage:<8} {r.name:<28} {r.seconds * 1e3:>9.2f} "
                         f"{100 * r.seconds / total:>5.1f}% {r.nodes:>6} "
                         f"{'yes' if r.changed else 'no'}")
        lines.append(f"{'':<10} {'total':<8} {'':<28} {total * 1e3:>9.2f}")
        return "\n".join(lines)


def graph_text(program: ExportedProgram) -> str:
    """The readable graph, subgraphs of control-flow ops included."""
    return str(program.graph_module.print_readable(print_output=False))


def graph_diff(before: str, after: str, record: PassRecord) -> str:
    """A unified diff of the graph text across one pass, headed by the pass's name."""
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(),
                                 fromfile=f"{record.method}: before {record.stage}/{record.name}",
                                 tofile=f"{record.method}: after {record.stage}/{record.name}",
                                 lineterm="")
    return "\n".join(lines)


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


def index_text(records: list[PassRecord]) -> str:
    """index.txt: a table of every pass in order (one row a pass, columns space-aligned)."""
    rows = [_INDEX_COLUMNS, *_index_rows(records)]
    numeric = {"#", "nodes before", "nodes after", "ms"}
    widths = [max(len(row[i]) for row in rows) for i in range(len(_INDEX_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) if column in numeric else cell.ljust(w)
                       for cell, w, column in zip(row, widths, _INDEX_COLUMNS)).rstrip()
             for row in rows]
    note = _misreport_note(records)
    return "\n".join([f"# exirc pass dump: {len(records)} passes; 'changed' is what a pass "
                      "says, 'graph' whether its graph text differs", *lines,
                      *([f"# warning: {note}"] if note else [])]) + "\n"


_STYLE = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
          "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}"
          "td.n{text-align:right;font-family:monospace}tr.same td{color:#888}"
          "tr.misreported td{background:#fdd}")


def index_html(records: list[PassRecord]) -> str:
    """index.html: the same table, self-contained (inline CSS, no scripts), with links."""
    header = "".join(f"<th>{html.escape(c)}</th>" for c in _INDEX_COLUMNS)
    body = []
    for record, row in zip(records, _index_rows(records)):
        cells = []
        for column, value in zip(_INDEX_COLUMNS, row):
            text = html.escape(value)
            if column in ("dump", "diff") and value != "-":
                text = f'<a href="{html.escape(value, quote=True)}">{column}</a>'
            numeric = column in ("#", "nodes before", "nodes after", "ms")
            cells.append(f'<td class="n">{text}</td>' if numeric else f"<td>{text}</td>")
        kind = ("misreported" if record.misreported
                else "same" if record.graph_changed is False else "changed")
        body.append(f'<tr class="{kind}">{"".join(cells)}</tr>')
    note = _misreport_note(records)
    warning = f"<p><strong>warning:</strong> {html.escape(note)}</p>" if note else ""
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>exirc pass dump"
            f"</title><style>{_STYLE}</style></head><body>\n<h1>exirc pass dump: "
            f"{len(records)} passes</h1>\n<p><em>changed</em> is what a pass says; "
            "<em>graph</em> whether its graph text differs.</p>\n"
            f"{warning}<table>\n<tr>{header}</tr>\n" + "\n".join(body) +
            "\n</table></body></html>\n")


def _node_count(program: ExportedProgram) -> int:
    """Nodes of the graph and of its subgraphs (control-flow branches and bodies), as
    the graph text shows them."""
    from torch.fx import GraphModule

    return sum(len(module.graph.nodes) for module in program.graph_module.modules()
               if isinstance(module, GraphModule))


def _is_ours(p: Pass) -> bool:
    implementation = p.function if isinstance(p, FunctionPass) else type(p)
    return str(getattr(implementation, "__module__", "")).startswith("exirc.")


def run_pass(p: Pass, program: ExportedProgram) -> PassResult:
    try:
        result = p.run(program)
    except ExircError:
        raise
    except Exception as error:
        message = f"pass {pass_label(p)} failed: {type(error).__name__}: {error}"
        # A plugin's failure is its author's to fix, not a bug to report to us.
        if not _is_ours(p):
            raise PluginError(message, hint="the error is in your pass; rerun with --debug "
                                            "for its traceback") from error
        raise InternalError(message) from error
    if not isinstance(result, PassResult):
        raise InternalError(f"pass {pass_label(p)} returned {type(result).__name__}, "
                            "not a PassResult")
    return result


def run_pipeline(program: ExportedProgram, pipeline: Pipeline, *, method: str,
                 verifiers: dict[str, Verifier], instrument: Instrumentation,
                 stage_seconds: dict[str, float]) -> ExportedProgram:
    """Run every stage's passes in order; each stage's verifier after it."""
    instrument.begin_method(program)
    for stage in STAGES:
        started = time.perf_counter()
        for p in pipeline.stages.get(stage, []):
            nodes_before = _node_count(program)
            t0 = time.perf_counter()
            result = run_pass(p, program)
            program = result.program
            instrument.after_pass(
                PassRecord(method, stage, pass_label(p), time.perf_counter() - t0,
                           result.changed, _node_count(program), nodes_before), program)
        verify = verifiers.get(stage)
        if verify is not None:
            verify(program)
        stage_seconds[stage] = stage_seconds.get(stage, 0.0) + time.perf_counter() - started
    return program
