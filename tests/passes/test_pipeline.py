"""Pipelines as data: parsing, user plugin passes, and pass instrumentation."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from exirc.cli.app import main
from exirc.edge.constant_fold import ConstantFold
from exirc.errors import UsageError
from exirc.passes.contract import FunctionPass, Pass, pass_label
from exirc.passes.pipeline import STAGES
from exirc.pipelines import BUILTIN_PASSES, load_pipeline, parse_pipeline
from exirc.serialize import deserialize
from tests.oracle import requires_executorch, run_with_executorch
from tests.plugin_modules import plugin_module

PORTABLE_PASSES = {
    "aten": [],
    "edge": ["to_edge", "remove_assertions", "views_to_copies", "merge_permutes",
             "scalars_to_tensors", "remove_noop_copies", "common_subexpressions",
             "constant_fold", "fold_batch_norm", "dead_code_elimination"],
    "backend": ["sym_prims", "linear_weights", "quant_fusion", "dead_code_elimination"],
    "plan": ["write_back_state", "alias_views", "to_out_variants", "memory_plan"],
}


def labels(stages: dict[str, list[Pass]]) -> dict[str, list[str]]:
    return {stage: [pass_label(p) for p in passes] for stage, passes in stages.items()}


def usage_error(text: str) -> UsageError:
    with pytest.raises(UsageError) as raised:
        parse_pipeline(textwrap.dedent(text), "my.yaml")
    return raised.value


# --------------------------------------------------------------------------
# The built-in pipelines.
# --------------------------------------------------------------------------


def test_default_targets_load() -> None:
    portable = load_pipeline("portable")
    assert portable.target == "portable"
    assert list(portable.stages) == list(STAGES)
    assert labels(portable.stages) == PORTABLE_PASSES
    fold = portable.stages["edge"][7]
    assert isinstance(fold, ConstantFold) and fold.max_bytes == 16777216

    fast = load_pipeline("exirc")
    assert fast.target == "exirc"
    assert labels(fast.stages)["backend"] == ["sym_prims", "quant_fusion", "linear_weights",
                                              "fuse", "dead_code_elimination"]
    assert fast.stages["backend"][3].patterns == ("linear_relu",)  # type: ignore[attr-defined]
    assert labels(fast.stages)["edge"] == PORTABLE_PASSES["edge"]


def test_every_builtin_pass_resolves() -> None:
    entries = "\n".join(f"    - {name}" for name in BUILTIN_PASSES)
    pipeline = parse_pipeline(f"stages:\n  edge:\n{entries}\n", "all.yaml")
    assert [pass_label(p) for p in pipeline.stages["edge"]] == list(BUILTIN_PASSES)
    assert pipeline.target == "portable"  # the default when the file names none


@pytest.mark.parametrize("target", ["portable", "exirc"])
def test_describe_round_trips_through_parse_pipeline(target: str) -> None:
    pipeline = load_pipeline(target)
    text = pipeline.describe()
    assert text.startswith(f"# pipeline from <target {target}>\n")
    again = parse_pipeline(text, "saved.yaml")
    assert again.target == pipeline.target
    assert again.stages == pipeline.stages  # frozen dataclasses: equal passes, equal options
    assert again.describe().splitlines()[1:] == text.splitlines()[1:]
    data = yaml.safe_load(text)
    assert list(data["stages"]) == list(STAGES)


def test_unknown_target_lists_the_targets() -> None:
    with pytest.raises(UsageError) as raised:
        load_pipeline("gpu")
    assert str(raised.value) == "unknown target 'gpu'"
    assert raised.value.hint == "targets: exirc, portable, xnnpack, xnnpack-llm"


# --------------------------------------------------------------------------
# Malformed pipeline files.
# --------------------------------------------------------------------------


def test_unknown_stage() -> None:
    error = usage_error("""\
        stages:
          edge: [to_edge]
          frontend: [to_edge]
        """)
    assert str(error) == "my.yaml: unknown stage(s) ['frontend']"
    assert error.hint == "stages are aten, edge, backend, plan"


def test_unknown_pass_lists_the_builtin_passes() -> None:
    error = usage_error("""\
        stages:
          edge:
            - to_edge
            - constant_folding
        """)
    assert str(error) == "my.yaml: edge[1]: unknown pass 'constant_folding'"
    assert error.hint is not None
    assert "constant_fold, dead_code_elimination" in error.hint
    assert "module:attr" in error.hint


def test_bad_option_lists_the_valid_options() -> None:
    error = usage_error("""\
        stages:
          plan:
            - memory_plan: {alignment: 16, algo: greedy}
        """)
    assert str(error) == "my.yaml: plan[0]: memory_plan has no option(s) ['algo']"
    assert error.hint == "its options: algorithm, alignment"


def test_a_pass_without_options_says_so() -> None:
    error = usage_error("""\
        stages:
          edge:
            - views_to_copies: {fast: true}
        """)
    assert error.hint == "its options: none"


@pytest.mark.parametrize(("text", "message"), [
    ("- to_edge\n- views_to_copies\n", "a pipeline is a mapping with `target` and `stages`"),
    ("just words\n", "a pipeline is a mapping with `target` and `stages`"),
    ("", "a pipeline is a mapping with `target` and `stages`"),
    ("target: portable\n", "a pipeline is a mapping with `target` and `stages`"),
    ("stages: [to_edge]\n", "a pipeline is a mapping with `target` and `stages`"),
    ("stages:\n  edge: to_edge\n", "stage edge must be a list of passes"),
    ("stages:\n  edge:\n    - constant_fold: 5\n", "options of constant_fold must be a mapping"),
    ("stages:\n  edge:\n    - {to_edge: {}, fuse: {}}\n", "a pass is a name or a one-key mapping"),
    ("stages: {edge: [to_edge\n", "not valid YAML"),
])
def test_malformed_files_are_usage_errors(text: str, message: str) -> None:
    error = usage_error(text)
    assert str(error).startswith("my.yaml: ")
    assert message in str(error)
    if "`stages`" in message:
        assert error.hint == "see `exirc compile --print-pipeline` for an example"


@pytest.mark.parametrize(("name", "message"), [
    ("no_such_module_xyz:Pass", "cannot import no_such_module_xyz: No module named"),
    ("exirc.edge.constant_fold:NoSuchPass", "exirc.edge.constant_fold has no NoSuchPass"),
    ("exirc.passes.pipeline:STAGES", "exirc.passes.pipeline:STAGES is neither a Pass class "
                                     "nor a function"),
])
def test_bad_plugin_references(name: str, message: str) -> None:
    error = usage_error(f"stages:\n  edge:\n    - {name}\n")
    assert str(error).startswith(f"my.yaml: edge[0]: {message}")


def test_an_unreadable_pipeline_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^cannot read pipeline file .*missing\.yaml: "
                                         r"No such file or directory$"):
        load_pipeline(path=tmp_path / "missing.yaml")


# --------------------------------------------------------------------------
# Compiling with a pipeline file: plugins and instrumentation.
# --------------------------------------------------------------------------

MODEL = """\
import torch

class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) * 2

model = AddRelu().eval()
example_inputs = (torch.randn(2, 3), torch.randn(2, 3))
"""

PLUGIN = """\
from dataclasses import dataclass
from typing import ClassVar

import torch

from exirc.passes.contract import Pass, PassResult

CALLS = []


@dataclass(frozen=True)
class SwapRelu(Pass):
    \"\"\"Edge -> Edge: relu becomes another unary op (a test plugin).\"\"\"

    name: ClassVar[str] = "swap_relu"
    replacement: str = "sigmoid"

    def run(self, program):
        new = getattr(torch.ops.aten, self.replacement).default
        changed = False
        for node in program.graph_module.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.aten.relu.default:
                node.target = new
                changed = True
        program.graph_module.recompile()
        CALLS.append(("swap_relu", self.replacement, changed))
        return PassResult(program, changed)


def count_nodes(program, *, label="plain"):
    CALLS.append(("count_nodes", label, len(program.graph_module.graph.nodes)))
    return PassResult(program, False)


def broken(program):
    return program  # not a PassResult


def raising(program):
    raise ValueError("bad plugin state")
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A plugin module on sys.path, under a name unique to the test."""
    yield from plugin_module(tmp_path, monkeypatch, PLUGIN, "exirc_test_plugin")


def compile_with(capsys: pytest.CaptureFixture[str], tmp_path: Path, pipeline: str,
                 *extra: str) -> tuple[int, str, str, Path]:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "pipeline.yaml").write_text(pipeline)
    output = tmp_path / "model.pte"
    code = main(["compile", str(tmp_path / "model.py"), "-o", str(output),
                 "--pipeline", str(tmp_path / "pipeline.yaml"), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, output


def portable_with(edge_extra: list[str]) -> str:
    """The portable pipeline's text with `edge_extra` entries after to_edge."""
    data = yaml.safe_load(load_pipeline("portable").describe())
    data["stages"]["edge"][1:1] = [yaml.safe_load(entry) for entry in edge_extra]
    return yaml.safe_dump(data, sort_keys=False)


def operators(pte: Path) -> set[str]:
    program = deserialize(pte.read_bytes())
    return {op.qualified_name for plan in program.execution_plan for op in plan.operators}


@requires_executorch
def test_a_plugin_pass_class_with_options_runs(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, plugin: str) -> None:
    text = portable_with([f"{plugin}:SwapRelu: {{replacement: tanh}}",
                          f"{plugin}:count_nodes: {{label: after_swap}}"])
    code, out, err, pte = compile_with(capsys, tmp_path, text, "-q")

    assert code == 0, err
    calls = sys.modules[plugin].CALLS
    assert calls[0] == ("swap_relu", "tanh", True)
    assert calls[1][:2] == ("count_nodes", "after_swap")
    assert "aten::tanh.out" in operators(pte) and "aten::relu.out" not in operators(pte)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (got,) = run_with_executorch(pte.read_bytes(), [x, y])
    torch.testing.assert_close(got, torch.tanh(x + y) * 2)


def test_a_plugin_function_with_options_runs(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, plugin: str) -> None:
    pipeline = parse_pipeline(f"stages:\n  edge:\n    - {plugin}:count_nodes: {{label: hi}}\n"
                              f"    - {plugin}:SwapRelu\n", "p.yaml")
    first, second = pipeline.stages["edge"]
    assert isinstance(first, FunctionPass) and first.options == (("label", "hi"),)
    assert pass_label(first) == "count_nodes"
    assert pass_label(second) == "swap_relu"
    assert second.replacement == "sigmoid"  # type: ignore[attr-defined]

    text = portable_with([f"{plugin}:count_nodes", f"{plugin}:SwapRelu"])
    code, _, err, pte = compile_with(capsys, tmp_path, text, "--time-passes")

    assert code == 0, err
    calls = sys.modules[plugin].CALLS
    assert [c[:2] for c in calls] == [("count_nodes", "plain"), ("swap_relu", "sigmoid")]
    assert "aten::sigmoid.out" in operators(pte)
    table = err.split("compiled ")[0]
    assert "count_nodes" in table and "swap_relu" in table


def test_a_plugin_returning_the_wrong_type_is_an_internal_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, plugin: str) -> None:
    code, out, err, pte = compile_with(capsys, tmp_path, portable_with([f"{plugin}:broken"]))
    assert code == 1
    assert out == ""
    assert err.startswith("error[E0100]: pass broken returned ExportedProgram, "
                          "not a PassResult\n")
    assert not pte.exists()


def test_a_plugin_that_raises_is_the_users_error_not_ours(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, plugin: str) -> None:
    code, out, err, pte = compile_with(capsys, tmp_path, portable_with([f"{plugin}:raising"]))
    assert code == 2
    assert out == ""
    assert err.startswith("error[E0202]: pass raising failed: ValueError: bad plugin state\n")
    assert "the error is in your pass" in err and "please report" not in err
    assert not pte.exists()


def test_print_pipeline_of_a_plugin_pipeline_can_be_read_back(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, plugin: str) -> None:
    pipeline = parse_pipeline(f"stages:\n  edge:\n    - {plugin}:SwapRelu: {{replacement: exp}}\n"
                              f"    - {plugin}:count_nodes\n", "p.yaml")
    again = parse_pipeline(pipeline.describe(), "saved.yaml")
    assert again.stages == pipeline.stages


def test_print_ir_after_all_prints_every_pass(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    code, out, err, _ = compile_with(capsys, tmp_path, load_pipeline("portable").describe(),
                                     "--print-ir-after-all")
    assert code == 0, err
    assert out == ""
    headers = [line for line in err.splitlines() if line.startswith("# after ")]
    expected = [f"# after {stage}/{name} (forward)"
                for stage, names in PORTABLE_PASSES.items() for name in names]
    assert headers == expected
    after_edge = err.split("# after edge/to_edge (forward)")[1].split("# after")[0]
    assert "torch.ops.aten.add.Tensor" in after_edge and "aten.add.out" not in after_edge
    after_plan = err.split("# after plan/to_out_variants (forward)")[1]
    assert "torch.ops.aten.add.out" in after_plan


def test_dump_dir_writes_one_file_per_pass(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    dump = tmp_path / "ir" / "nested"
    code, _, err, pte = compile_with(capsys, tmp_path, load_pipeline("exirc").describe(),
                                     "--dump-dir", str(dump))
    assert code == 0, err
    assert pte.exists()
    names = sorted(p.name for p in dump.iterdir()
                   if p.name.startswith("forward.") and p.suffix == ".txt")
    expected_passes = [(stage, pass_label(p)) for stage, passes in
                       load_pipeline("exirc").stages.items() for p in passes]
    assert names == ["forward.00.captured.txt", *(f"forward.{i:02d}.{stage}.{name}.txt"
                     for i, (stage, name) in enumerate(expected_passes, start=1))]
    for name, (stage, pass_name) in zip(names[1:], expected_passes):
        text = (dump / name).read_text()
        assert text.startswith(f"# after {stage}/{pass_name} (forward)\n")
        assert "def forward(self" in text
    assert "# after" not in err  # files, not the terminal


def test_time_passes_prints_a_table_with_every_pass(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    code, out, err, _ = compile_with(capsys, tmp_path, load_pipeline("portable").describe(),
                                     "--time-passes")
    assert code == 0, err
    assert out == ""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["method", "stage",
                                                                          "pass"])
    rows = [line.split() for line in lines[start + 1:] if line.startswith("forward ")]
    assert [(r[1], r[2]) for r in rows] == [(stage, name) for stage, names in
                                           PORTABLE_PASSES.items() for name in names]
    for row in rows:
        assert float(row[3]) >= 0 and row[4].endswith("%") and row[-1] in ("yes", "no")
    to_edge = next(r for r in rows if r[2] == "to_edge")
    assert to_edge[-1] == "yes"
    total = lines[start + 1 + len(rows)].split()
    assert total[0] == "total"
    assert float(total[1]) == pytest.approx(sum(float(r[3]) for r in rows), abs=0.05)


def test_a_bad_pipeline_file_stops_the_compile(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    text = "stages:\n  edge:\n    - to_edge\n    - constant_fold: {max_byte: 1}\n"
    code, out, err, pte = compile_with(capsys, tmp_path, text)
    assert code == 2
    assert out == ""
    first, *rest = err.strip().splitlines()
    assert first.startswith("error[E0200]: ") and first.endswith(
        "pipeline.yaml: edge[1]: constant_fold has no option(s) ['max_byte']")
    assert rest == ["  hint: its options: max_bytes", "  see: exirc explain E0200"]
    assert not pte.exists()
