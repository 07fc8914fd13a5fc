"""Pass instrumentation: printing, diffing, dumping and timing the IR between passes.

Instrumentation is what a compiler engineer asks for when a pass misbehaves:

    --print-ir-after-all     the graph after every pass
    --print-ir-after-change  the graph after each pass that changed it
    --print-ir-diff          a unified diff of each pass that changed the graph
    --dump-dir DIR           the captured graph, one file per pass, a .diff (and a
                             coloured .diff.html) per changing pass, the memory
                             plan and final listing once the compile ends, and
                             index.txt / index.html: files, passes, node counts, timings
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
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from exirc.passes.dump_diff_html import diff_html
from exirc.passes.dump_index import DumpFile, index_html, index_text
from exirc.passes.record import PassRecord
from exirc.serialize.files import write_error

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass
class Instrumentation:
    print_ir_after_all: bool = False
    dump_dir: Path | None = None
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    records: list[PassRecord] = field(default_factory=list)
    print_ir_after_change: bool = False
    print_ir_diff: bool = False
    # The dump directory's files beyond the passes' own (captured graphs, ...).
    dump_files: list[DumpFile] = field(default_factory=list)
    # The graph text before the next pass (that is, after the previous one).
    _previous_text: str | None = field(default=None, init=False, repr=False)

    @property
    def prints(self) -> bool:
        return self.print_ir_after_all or self.print_ir_after_change or self.print_ir_diff

    @property
    def needs_text(self) -> bool:
        return self.prints or self.dump_dir is not None

    def begin_method(self, program: ExportedProgram, method: str = "forward") -> None:
        """Remember the graph before a method's first pass (the first diff's left
        side); a dump keeps it as the method's captured graph."""
        self._previous_text = graph_text(program) if self.needs_text else None
        if self.dump_dir is not None and self._previous_text is not None:
            self.add_dump_files([(DumpFile(f"{method}: captured graph (ATen dialect, before "
                                           "the first pass)", f"{_safe(method)}.00.captured.txt"),
                                  f"# captured {method}\n{self._previous_text}")])

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
        stem = f"{record.method}.{len(self.records):02d}.{record.stage}.{_safe(record.name)}"
        record.dump_file = f"{stem}.txt"
        files = {record.dump_file: text}
        if diff:
            record.diff_file, record.diff_page = f"{stem}.diff", f"{stem}.diff.html"
            files[record.diff_file] = diff + "\n"
            files[record.diff_page] = diff_html(diff, title=f"{record.label}: diff")
        self._write(directory, files)

    def add_dump_files(self, files: list[tuple[DumpFile, str]]) -> None:
        """Write files beside the passes' dumps (each a DumpFile and its text) and
        list them in the index; nothing without a dump directory."""
        if self.dump_dir is None:
            return
        self.dump_files.extend(f for f, _ in files)
        self._write(self.dump_dir, {f.name: text for f, text in files})

    def _write(self, directory: Path, files: dict[str, str]) -> None:
        # The index is rewritten with every write, so a compile that fails part
        # way still leaves an index of what ran.
        files = {**files, "index.txt": index_text(self.records, self.dump_files),
                 "index.html": index_html(self.records, self.dump_files)}
        target = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                target = directory / name
                target.write_text(content)
        except OSError as error:  # a full disk is the user's to fix, not a bug of ours
            raise write_error(str(target), error) from None

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


def _safe(name: str) -> str:
    """`name` as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


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
