"""Pass debugging: --print-ir-after-change, --print-ir-diff and the --dump-dir index.

Most tests share one compile of a tiny MLP with every debugging option on
(its stderr captured); the rest run the CLI with a plugin pipeline.
"""

from __future__ import annotations

import contextlib
import difflib
import html
import io
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from exirc.capture import MethodSource, capture
from exirc.cli.app import main
from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.memory_report import memory_report
from exirc.inspector.memory_report_html import memory_plan_html
from exirc.inspector.render import render_instructions
from exirc.passes.instrument import graph_text
from exirc.passes.runner import Instrumentation, PassRecord
from exirc.plan.limits import ArenaLimitError
from exirc.serialize.symbolic_shapes import stored_symbolic_shapes
from tests.passes.test_pipeline import compile_with, portable_with
from tests.plugin_modules import plugin_module


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2)).eval()


INPUTS = (torch.randn(3, 4),)


@dataclass
class Debugged:
    records: list[PassRecord]
    err: str
    dump: Path
    result: CompileResult


def compile_tiny(**options: object) -> tuple[CompileResult, str]:
    """Compile the tiny MLP with `options`; the result and what went to stderr."""
    stream = io.StringIO()
    with contextlib.redirect_stderr(stream):  # the instrumentation prints to sys.stderr
        result = compile_module(tiny_mlp(), INPUTS, options=CompileOptions(**options))  # type: ignore[arg-type]
    assert result.report.instrument is not None
    return result, stream.getvalue()


@pytest.fixture(scope="module")
def debugged(tmp_path_factory: pytest.TempPathFactory) -> Debugged:
    dump = tmp_path_factory.mktemp("ir")
    result, err = compile_tiny(print_ir_after_change=True, print_ir_diff=True, dump_dir=dump)
    assert result.report.instrument is not None
    return Debugged(result.report.instrument.records, err, dump, result)


def after_headers(err: str) -> list[str]:
    return [line.removeprefix("# after ") for line in err.splitlines()
            if line.startswith("# after ")]


def diffs(err: str) -> dict[str, str]:
    """The printed diffs, keyed by `stage/pass`; each runs to the next block."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in err.splitlines():
        if line.startswith("--- forward: before "):
            current = found.setdefault(line.removeprefix("--- forward: before "), [])
        elif line.startswith("# after "):
            current = None
        if current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in found.items()}


def changed_lines(diff: str, sign: str) -> list[str]:
    return [line[1:] for line in diff.splitlines()
            if line.startswith(sign) and not line.startswith(sign * 3)]


def label(record: PassRecord) -> str:
    return f"{record.stage}/{record.name}"


def record_named(records: list[PassRecord], name: str) -> PassRecord:
    (record,) = [r for r in records if r.name == name]
    return record


# --------------------------------------------------------------------------
# --print-ir-after-change and --print-ir-diff.
# --------------------------------------------------------------------------


def test_after_change_prints_exactly_the_passes_that_changed_the_graph(
        debugged: Debugged) -> None:
    records = debugged.records
    printed = after_headers(debugged.err)
    assert printed == [f"{label(r)} (forward)" for r in records if r.changed and r.graph_changed]
    assert "edge/views_to_copies (forward)" in printed
    assert "plan/to_out_variants (forward)" in printed
    # A pass that changes nothing on this model, and says so.
    noop = record_named(records, "remove_assertions")
    assert (noop.changed, noop.graph_changed) == (False, False)
    # memory_plan says it changed the program, but only `meta`: nothing to print.
    plan = record_named(records, "memory_plan")
    assert (plan.changed, plan.graph_changed) == (True, False)
    assert not any(line.startswith(("# after edge/remove_assertions", "# after plan/memory_plan"))
                   for line in debugged.err.splitlines())
    assert "warning:" not in debugged.err  # the built-in passes report truthfully


def test_diff_shows_what_views_to_copies_and_to_out_variants_changed(
        debugged: Debugged) -> None:
    printed = diffs(debugged.err)
    assert list(printed) == [label(r) for r in debugged.records if r.graph_changed]

    views = printed["edge/views_to_copies"]
    assert views.splitlines()[:2] == ["--- forward: before edge/views_to_copies",
                                      "+++ forward: after edge/views_to_copies"]
    removed, added = changed_lines(views, "-"), changed_lines(views, "+")
    assert len(removed) == len(added) == 2  # one permute per Linear
    assert all("torch.ops.aten.permute.default(" in line for line in removed)
    assert all("torch.ops.aten.permute_copy.default(" in line for line in added)
    assert [line.replace("permute_copy", "permute") for line in added] == removed

    out_variants = printed["plan/to_out_variants"]
    record = record_named(debugged.records, "to_out_variants")
    allocs = [line for line in changed_lines(out_variants, "+") if "alloc(" in line]
    assert len(allocs) == record.nodes - record.nodes_before == 3  # one alloc per op
    assert any(".addmm.out(" in line for line in changed_lines(out_variants, "+"))
    assert not any(".out(" in line for line in changed_lines(out_variants, "-"))


def test_after_all_with_diff_prints_each_graph_then_its_diff() -> None:
    result, err = compile_tiny(print_ir_after_all=True, print_ir_diff=True)
    assert result.report.instrument is not None
    records = result.report.instrument.records
    assert after_headers(err) == [f"{label(r)} (forward)" for r in records]
    assert list(diffs(err)) == [label(r) for r in records if r.graph_changed]
    # The graph after a pass comes before its diff, and the diff before the next pass.
    lines = err.splitlines()
    for name in ("edge/views_to_copies", "plan/to_out_variants"):
        graph = lines.index(f"# after {name} (forward)")
        diff = lines.index(f"--- forward: before {name}")
        following = [i for i, line in enumerate(lines) if line.startswith("# after ")
                     and i > graph]
        assert graph < diff < (following[0] if following else len(lines))


class Choose(torch.nn.Module):
    """torch.cond with a view in each branch: views_to_copies changes only subgraphs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def positive(x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x).permute(1, 0)

        def negative(x: torch.Tensor) -> torch.Tensor:
            return (x * 2).permute(1, 0)

        return torch.cond(x.sum() > 0, positive, negative, (x,))


def test_the_graph_text_and_node_counts_include_control_flow_subgraphs() -> None:
    stream = io.StringIO()
    with contextlib.redirect_stderr(stream):
        result = compile_module(Choose().eval(), (torch.randn(2, 3),),
                                options=CompileOptions(print_ir_diff=True))
    assert result.report.instrument is not None
    views = diffs(stream.getvalue())["edge/views_to_copies"]
    removed, added = changed_lines(views, "-"), changed_lines(views, "+")
    # One permute per branch, printed inside the branch's class (deeper indentation).
    assert len(removed) == len(added) == 2
    assert all(line.startswith(" " * 12) and "aten.permute.default(" in line for line in removed)
    assert all("aten.permute_copy.default(" in line for line in added)
    exported = capture(MethodSource("forward", Choose().eval(), (torch.randn(2, 3),), None,
                                    None, "<module>"))
    top_level = len(exported.graph_module.graph.nodes)
    first = result.report.instrument.records[0]
    assert first.nodes_before > top_level  # the branches' nodes count too


def test_without_debugging_flags_the_graph_is_never_printed() -> None:
    instrument = Instrumentation(stream=io.StringIO())
    record = PassRecord("forward", "edge", "to_edge", 0.1, True, 11, 9)
    # No flag needs the graph text, so the program is never touched.
    instrument.begin_method(None)  # type: ignore[arg-type]
    instrument.after_pass(record, None)  # type: ignore[arg-type]
    assert instrument.records == [record]
    assert record.graph_changed is None
    assert instrument.stream.getvalue() == ""  # type: ignore[attr-defined]


def readable(text: str) -> SimpleNamespace:
    """A stand-in program whose graph prints as `text`."""
    return SimpleNamespace(graph_module=SimpleNamespace(
        print_readable=lambda print_output: text))


def test_the_index_is_current_after_every_pass(tmp_path: Path) -> None:
    # So a compile that fails part way still leaves an index of what ran.
    instrument = Instrumentation(dump_dir=tmp_path, stream=io.StringIO())
    instrument.begin_method(readable("a\n"))  # type: ignore[arg-type]
    instrument.after_pass(PassRecord("forward", "edge", "first", 0.001, True, 2, 1),
                          readable("a\nb\n"))  # type: ignore[arg-type]
    assert [row[3] for row in index_rows(tmp_path)] == ["first"]
    instrument.after_pass(PassRecord("forward", "edge", "second", 0.001, False, 2, 2),
                          readable("a\nb\n"))  # type: ignore[arg-type]
    assert [row[3:8] for row in index_rows(tmp_path)] == [
        ["first", "1", "2", "yes", "differs"], ["second", "2", "2", "no", "same"]]
    assert (tmp_path / "forward.01.edge.first.diff").read_text() == (
        "--- forward: before edge/first\n+++ forward: after edge/first\n"
        "@@ -1 +1,2 @@\n a\n+b\n")
    assert instrument.stream.getvalue() == ""  # type: ignore[attr-defined]  # files only


# --------------------------------------------------------------------------
# --dump-dir: files, diffs and the index.
# --------------------------------------------------------------------------


def index_rows(dump: Path) -> list[list[str]]:
    """index.txt's rows (a pass each), split into cells."""
    return [line.split() for line in (dump / "index.txt").read_text().splitlines()
            if line[:2].isdigit()]


class _TableCells(HTMLParser):
    """Each <tr>'s cells: a link's href, else the cell's text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self.rows[-1].append("")
        elif tag == "a" and "td" in self.tags:  # not the file list above the table
            self.rows[-1][-1] = dict(attrs)["href"] or ""

    def handle_endtag(self, tag: str) -> None:
        self.tags.pop()

    def handle_data(self, data: str) -> None:
        if self.tags[-1:] == ["td"]:
            self.rows[-1][-1] += data


def test_index_lists_every_pass_in_order_with_node_counts(debugged: Debugged) -> None:
    rows = index_rows(debugged.dump)
    records = debugged.records
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (f"{i:02d}", "forward", rec.stage, rec.name) for i, rec in enumerate(records, start=1)]
    for row, record in zip(rows, records):
        number, _, _, _, before, after, changed, graph, ms, dump, diff = row
        assert (int(before), int(after)) == (record.nodes_before, record.nodes)
        assert changed == ("yes" if record.changed else "no")
        assert graph == ("differs" if record.graph_changed else "same")
        assert float(ms) == pytest.approx(record.seconds * 1e3, abs=0.01)
        assert dump == f"forward.{number}.{record.stage}.{record.name}.txt"
        assert (debugged.dump / dump).read_text().startswith(f"# after {label(record)} ")
        assert diff == (dump.replace(".txt", ".diff") if record.graph_changed else "-")
    # Node counts chain: a pass starts from what the one before it left.
    exported = capture(MethodSource("forward", tiny_mlp(), INPUTS, None, None, "<module>"))
    assert int(rows[0][4]) == len(exported.graph_module.graph.nodes)
    assert all(rows[i][4] == rows[i - 1][5] for i in range(1, len(rows)))
    names = {p.name for p in debugged.dump.iterdir()}
    diffs = {r[10] for r in rows if r[10] != "-"}
    assert names == {"index.txt", "index.html", *OTHER_FILES.values()} | \
        {r[9] for r in rows} | diffs | {f"{d}.html" for d in diffs}


# The files a dump holds beside the passes' own, by what the index calls them.
OTHER_FILES = {
    "forward: captured graph (ATen dialect, before the first pass)": "forward.00.captured.txt",
    "memory plan (as `exirc inspect --memory-plan`)": "memory-plan.html",
    "final program (as `exirc inspect --show instructions`)": "program.txt",
}


def index_files(dump: Path) -> dict[str, str]:
    """index.txt's `# label: file` lines, before the table."""
    found = {}
    for line in (dump / "index.txt").read_text().splitlines():
        if line.startswith("# exirc pass dump"):
            return found
        label, _, name = line.removeprefix("# ").rpartition(": ")
        found[label] = name
    raise AssertionError("index.txt has no table")


def test_index_links_the_captured_graph_the_memory_plan_and_the_final_listing(
        debugged: Debugged) -> None:
    assert index_files(debugged.dump) == OTHER_FILES
    text = (debugged.dump / "index.html").read_text()
    for label, name in OTHER_FILES.items():
        assert f'<li>{html.escape(label)}: <a href="{name}">{name}</a></li>' in text


def test_the_captured_graph_is_the_first_diffs_left_side(debugged: Debugged) -> None:
    captured = (debugged.dump / "forward.00.captured.txt").read_text().splitlines()
    assert captured[0] == "# captured forward"
    exported = capture(MethodSource("forward", tiny_mlp(), INPUTS, None, None, "<module>"))
    assert captured[1:] == graph_text(exported).splitlines()
    first = index_rows(debugged.dump)[0]
    assert first[10] != "-"  # to_edge changes the graph
    after = (debugged.dump / first[9]).read_text().splitlines()[1:]
    assert (debugged.dump / first[10]).read_text().splitlines()[2:] == list(
        difflib.unified_diff(captured[1:], after, lineterm=""))[2:]


def test_the_final_listing_and_memory_plan_are_inspects(debugged: Debugged) -> None:
    program = debugged.result.program
    assert (debugged.dump / "program.txt").read_text() == render_instructions(
        program.execution_plan, str, stored_symbolic_shapes(program), program) + "\n"
    assert "aten::addmm.out" in (debugged.dump / "program.txt").read_text()
    page = (debugged.dump / "memory-plan.html").read_text()
    assert page == memory_plan_html(memory_report(program), title="the compiled program")
    assert "largest" in page


def test_each_diff_has_a_coloured_page_with_the_same_lines(debugged: Debugged) -> None:
    classes = {"+": "add", "-": "del", "@": "hunk", " ": "context"}
    pages = 0
    for row in index_rows(debugged.dump):
        if row[10] == "-":
            continue
        lines = (debugged.dump / row[10]).read_text().splitlines()
        page = _DiffLines()
        page.feed((debugged.dump / f"{row[10]}.html").read_text())
        assert [text for _, text in page.lines] == [line or " " for line in lines]
        expected = ["file", "file", *(classes[line[:1] or " "] for line in lines[2:])]
        assert [kind for kind, _ in page.lines] == expected
        assert {"add", "del"} & set(expected)
        pages += 1
    assert pages >= 2


class _DiffLines(HTMLParser):
    """A diff page's lines: each <span>'s class and text."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []
        self.inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "span":
            self.lines.append((dict(attrs)["class"] or "", ""))
            self.inside = True

    def handle_endtag(self, tag: str) -> None:
        self.inside = self.inside and tag != "span"

    def handle_data(self, data: str) -> None:
        if self.inside:
            kind, text = self.lines[-1]
            self.lines[-1] = (kind, text + data)


def test_index_html_is_the_same_table_with_links(debugged: Debugged) -> None:
    text = (debugged.dump / "index.html").read_text()
    assert "<script" not in text and "<link" not in text and "src=" not in text
    table = _TableCells()
    table.feed(text)
    header, *rows = table.rows
    assert header == []  # <th> cells
    # The same cells, but a diff links its coloured page.
    assert rows == [[*row[:10], row[10] if row[10] == "-" else f"{row[10]}.html"]
                    for row in index_rows(debugged.dump)]


def test_a_failed_compile_leaves_an_index_of_what_ran(tmp_path: Path) -> None:
    with pytest.raises(ArenaLimitError):
        compile_tiny(dump_dir=tmp_path, max_arena_bytes=16)
    assert index_files(tmp_path) == {
        "forward: captured graph (ATen dialect, before the first pass)":
            "forward.00.captured.txt"}
    rows = index_rows(tmp_path)
    assert rows and rows[-1][3] == "memory_plan"
    assert not (tmp_path / "program.txt").exists()


def test_dumped_diffs_are_the_printed_diffs_of_consecutive_dumps(debugged: Debugged) -> None:
    printed = diffs(debugged.err)
    rows = index_rows(debugged.dump)

    def graph(dump: str) -> list[str]:
        return (debugged.dump / dump).read_text().splitlines()[1:]  # minus the "# after" line

    for previous, row in zip(rows, rows[1:]):
        name, dump, diff = f"{row[2]}/{row[3]}", row[9], row[10]
        if diff == "-":
            assert graph(dump) == graph(previous[9])
            continue
        text = (debugged.dump / diff).read_text()
        assert text == printed[name] + "\n"
        assert text.splitlines()[2:] == list(difflib.unified_diff(
            graph(previous[9]), graph(dump), lineterm=""))[2:]


# --------------------------------------------------------------------------
# A pass that misreports `changed`, through a plugin pipeline on the CLI.
# --------------------------------------------------------------------------

MISREPORTING = """\
import torch

from exirc.passes.contract import PassResult


def sneaky_swap(program):
    \"\"\"Turns relu into sigmoid, but says it changed nothing.\"\"\"
    for node in program.graph_module.graph.nodes:
        if node.target is torch.ops.aten.relu.default:
            node.target = torch.ops.aten.sigmoid.default
    program.graph_module.recompile()
    return PassResult(program, False)


def claims_a_change(program):
    \"\"\"Changes nothing, but says it did (harmless: nothing is printed).\"\"\"
    return PassResult(program, True)
"""


@pytest.fixture
def misreporting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from plugin_module(tmp_path, monkeypatch, MISREPORTING, "exirc_test_misreporting")


def test_a_pass_that_misreports_changed_gets_a_warning(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, misreporting: str) -> None:
    pipeline = portable_with([f"{misreporting}:sneaky_swap", f"{misreporting}:claims_a_change"])
    dump = tmp_path / "ir"
    code, out, err, pte = compile_with(capsys, tmp_path, pipeline,
                                       "--print-ir-after-change", "--dump-dir", str(dump))
    assert code == 0, err
    assert out == ""
    warning = ("warning: pass edge/sneaky_swap (forward) says it changed nothing, but the "
               "graph differs: fix the `changed` of its PassResult")
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [warning]
    # It did change the graph, so its graph is printed (after the warning).
    printed = after_headers(err)
    assert "edge/sneaky_swap (forward)" in printed
    assert "edge/claims_a_change (forward)" not in printed
    after_swap = err.split("# after edge/sneaky_swap (forward)\n")[1].split("# after ")[0]
    assert "aten.sigmoid.default" in after_swap and "aten.relu.default" not in after_swap

    rows = {row[3]: row for row in index_rows(dump)}
    assert rows["sneaky_swap"][6:8] == ["no", "differs"]
    assert rows["claims_a_change"][6:8] == ["yes", "same"]
    index = (dump / "index.txt").read_text()
    assert index.endswith("# warning: passes that changed the graph but said they did not: "
                          "edge/sneaky_swap (forward)\n")
    assert index.count("warning") == 1
    assert '<tr class="misreported">' in (dump / "index.html").read_text()
    assert pte.exists()


def test_help_documents_the_flags_and_how_they_combine(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--print-ir-after-all", "--print-ir-after-change", "--print-ir-diff",
                 "--dump-dir", "--max-arena SIZE"):
        assert flag in out
    assert "with either flag above, the graph and then its diff" in out
    assert "index.txt and\n" in out and "memory-plan.html and program.txt" in out
