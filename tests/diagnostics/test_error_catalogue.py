"""The error catalogue and `exirc explain`.

Three promises: every error class in exirc has a catalogue entry and every
entry has a class; every code is triggered here through the real command
line and its code, message (with the values involved) and hint are checked;
and `exirc explain` prints the entries without importing torch.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy
import numpy.typing
import pytest

import exirc
from exirc.cli.explain_command import WIDTH
from exirc.diagnostics.catalogue import CATALOGUE, closest_codes, lookup
from exirc.diagnostics.error_doc import EXIT_CODES
from exirc.errors import (
    ExircError,
    ExternalDataError,
    FormatError,
    InputError,
    InternalError,
    ModelError,
    UsageError,
)
from exirc.quantize.calibration import CalibrationError
from exirc.runtime.errors import ExecutionError, StepLimitError
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.compile.test_cli_compile import MLP, NOT_EDGE, RAISES, UNSUPPORTED, write
from tests.passes.test_pipeline import PLUGIN, portable_with
from tests.programs import add_constant_program, control_flow_program, index_out_of_range_program
from tests.runtime.core.test_interpreter import loop_program
from tests.test_error_codes import _all_error_classes


def exirc_error_classes() -> list[type[ExircError]]:
    """Every ExircError class defined in the exirc package (not in tests or plugins)."""
    return [cls for cls in _all_error_classes() if cls.__module__.split(".")[0] == "exirc"]


# --------------------------------------------------------------------------
# The catalogue matches the error classes, in both directions.
# --------------------------------------------------------------------------


def test_every_error_class_has_a_catalogue_entry() -> None:
    for cls in exirc_error_classes():
        doc = CATALOGUE.get(cls.code)
        assert doc is not None, (
            f"{cls.__module__}.{cls.__name__} has code {cls.code}, which is not documented: "
            "add an ErrorDoc for it to the catalogue (exirc/diagnostics/catalogue_*.py)")
        assert doc.raised_as == f"{cls.__module__}.{cls.__qualname__}", cls.code
        assert doc.exit_code == cls.exit_code, (
            f"{cls.code}: the catalogue says exit code {doc.exit_code}, "
            f"{cls.__name__} exits with {cls.exit_code}")


def test_every_catalogue_entry_belongs_to_an_error_class() -> None:
    used = {cls.code for cls in exirc_error_classes()}
    orphans = sorted(set(CATALOGUE) - used)
    assert not orphans, f"no error class uses {orphans}: remove their catalogue entries"


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_every_entry_is_complete(code: str) -> None:
    doc = CATALOGUE[code]
    assert doc.code == code
    assert doc.exit_code in EXIT_CODES and doc.exit_code != 0
    assert doc.title and doc.title == doc.title.strip() and not doc.title.endswith(".")
    assert len(doc.meaning) > 80, "say what it means in a few sentences"
    assert doc.causes and doc.what_to_do
    assert all(item and not item.endswith(".") for item in (*doc.causes, *doc.what_to_do))
    assert doc.example.startswith(f"error[{code}]: ")


# --------------------------------------------------------------------------
# Each code, triggered through the command line: code, message and hint.
# --------------------------------------------------------------------------

# The real exit paths print exactly this (`exirc.cli.app.report_error`).
REPORT = re.compile(r"error\[(?P<code>E\d{4})\]: (?P<message>.*?)\n"
                    r"  hint: (?P<hint>.*?)\n"
                    r"  see: exirc explain (?P=code)\n", re.DOTALL)

# Added to tests.passes.test_pipeline's PLUGIN (passes `broken` and `raising`).
RETYPE_MUL = """

def retype_mul(program):
    # Claims float * float gives int64: a pass bug the Edge verifier must catch.
    for node in program.graph_module.graph.nodes:
        if node.target is torch.ops.aten.mul.Tensor:
            node.meta["val"] = node.meta["val"].to(torch.int64)
    return PassResult(program, True)
"""

MUL = """\
import torch

class Scale(torch.nn.Module):
    def forward(self, x, y):
        return x * y

model = Scale().eval()
example_inputs = (torch.randn(2, 3), torch.randn(2, 3))
"""

UNBOUNDED = """\
import torch

class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2

model = Double().eval()
example_inputs = (torch.randn(4, 3),)
dynamic_shapes = ({0: torch.export.Dim("batch")},)
"""


def exactly(text: str | None) -> str:
    """A regex matching just `text` (None, a missing hint, matches nothing)."""
    return re.escape(text) if text is not None else r"(?!)"


@dataclass(frozen=True)
class Case:
    """One way to trigger an error, and what the user must be told."""

    code: str
    exit_code: int
    argv: Callable[[Path, str], list[str]]  # (working directory, plugin module) -> argv
    message: str  # a regex the whole message must match
    hint: str  # a regex the whole hint must match


def with_plugin_pass(name: str) -> Callable[[Path, str], list[str]]:
    """`exirc compile` of MUL with a pipeline of to_edge and the plugin's pass `name`."""

    def argv(directory: Path, plugin: str) -> list[str]:
        write(directory, "model.py", MUL)
        write(directory, "pipeline.yaml", f"stages:\n  edge:\n    - to_edge\n"
                                          f"    - {plugin}:{name}\n")
        return ["compile", "model.py", "--pipeline", "pipeline.yaml"]

    return argv

# A custom op whose decomposition (registered with torch) raises: torch's
# run_decompositions fails in code it called, not in exirc.
FAILING_DECOMPOSITION = """\
import torch
from torch._decomp import register_decomposition

torch.library.define("exirc_catalogue::twice", "(Tensor x) -> Tensor")
torch.library.impl("exirc_catalogue::twice", "CompositeExplicitAutograd")(lambda x: x * 2)
torch.library.register_fake("exirc_catalogue::twice")(lambda x: torch.empty_like(x))

def twice_decomposition(x):
    raise RuntimeError("twice has no decomposition for this input")

register_decomposition(torch.ops.exirc_catalogue.twice.default)(twice_decomposition)

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.exirc_catalogue.twice(x) + 1

model = Model().eval()
example_inputs = (torch.randn(2, 3),)
"""

# One cache read by a decode method's attention that binds to ExecuTorch's llama ops
# and by a prefill whose mask (one position ahead) does not.
TWO_LAYOUTS = """\
import copy
import torch
import torch.nn.functional as F

class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 8, 4), persistent=False)
        self.register_buffer("v", torch.zeros(1, 2, 8, 4), persistent=False)
        self.ahead = 0

    def forward(self, q, pos):
        positions = pos[0] + torch.arange(q.shape[2])
        k = self.k.index_copy_(2, positions, q)
        v = self.v.index_copy_(2, positions, q + 1)
        rows = positions + 1 if self.ahead else positions
        mask = torch.arange(8)[None, :] <= rows[:, None]
        return F.scaled_dot_product_attention(q, k, v, mask)

model = Attention().eval()
example_inputs = (torch.randn(1, 2, 1, 4), torch.tensor([0]))
prefill = copy.copy(model)
prefill.ahead = 1
methods = {"prefill": (prefill, (torch.randn(1, 2, 2, 4), torch.tensor([0])))}
"""

# A decoder step in miniature: a cache buffer written at the position it is given.
CACHED = """\
import torch

class Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(8, 4))

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.fc(x))
        return self.cache.sum(0)

model = Step().eval()
example_inputs = (torch.randn(1, 4), torch.tensor([0]))
"""


def compile_model(source: str, *options: str) -> Callable[[Path, str], list[str]]:
    """`exirc compile model.py` of `source`, with the default pipeline."""

    def argv(directory: Path, plugin: str) -> list[str]:
        write(directory, "model.py", source)
        return ["compile", "model.py", *options]

    return argv


def run_program(build: Callable[[], P.Program], *options: str,
                inputs: numpy.typing.NDArray[numpy.float32] | None = None
                ) -> Callable[[Path, str], list[str]]:
    """`exirc run p.pte` of the program `build` makes, with `inputs` saved as x.npy."""

    def argv(directory: Path, plugin: str) -> list[str]:
        (directory / "p.pte").write_bytes(serialize(build()))
        if inputs is None:
            return ["run", "p.pte", *options]
        numpy.save(directory / "x.npy", inputs)
        return ["run", "p.pte", "--inputs", "x.npy", *options]

    return argv


def external_weight_program() -> P.Program:
    """add_constant_program with its weight kept in an external data file, by name."""
    program = add_constant_program()
    weight = program.execution_plan[0].values[1]
    assert isinstance(weight, P.Tensor)
    weight.extra_tensor_info = P.ExtraTensorInfo(fully_qualified_name="w",
                                                 location=P.TensorDataLocation.EXTERNAL)
    return program


def verify_swapped_relu(directory: Path, plugin: str) -> list[str]:
    """`exirc compile --verify` of MLP with a plugin pass that turns relu into sigmoid."""
    write(directory, "model.py", MLP)
    write(directory, "swap.yaml", portable_with([f"{plugin}:SwapRelu"]))
    return ["compile", "model.py", "--pipeline", "swap.yaml", "--verify"]


def without_to_edge(directory: Path, plugin: str) -> list[str]:
    """`exirc compile` of MLP with an edge stage that forgets to_edge: a pipeline bug."""
    write(directory, "model.py", MLP)
    write(directory, "no_to_edge.yaml", "stages:\n  edge:\n    - views_to_copies\n")
    return ["compile", "model.py", "--pipeline", "no_to_edge.yaml"]


def inspect_bytes(data: bytes) -> Callable[[Path, str], list[str]]:
    """`exirc inspect bad.pte` of a file holding `data`."""

    def argv(directory: Path, plugin: str) -> list[str]:
        (directory / "bad.pte").write_bytes(data)
        return ["inspect", "bad.pte"]

    return argv


CASES = [
    Case("E0100", 1, with_plugin_pass("broken"),
         re.escape("pass broken returned ExportedProgram, not a PassResult"),
         exactly(InternalError.default_hint)),
    Case("E0200", 2, lambda directory, plugin: ["inspect", "nope.pte"],
         re.escape("no such file: nope.pte"), exactly("check the path")),
    Case("E0200", 2, run_program(add_constant_program, "--random",
                                 inputs=numpy.zeros((2, 3), numpy.float32)),
         re.escape("give --inputs or --random, not both"), exactly(UsageError.default_hint)),
    Case("E0201", 2, run_program(add_constant_program, inputs=numpy.zeros((3, 2), numpy.float32)),
         re.escape("input_0 has shape [3, 2], expected [2, 3] (f32[2, 3])"),
         exactly(InputError.default_hint)),
    Case("E0202", 2, with_plugin_pass("raising"),
         re.escape("pass raising failed: ValueError: bad plugin state"),
         exactly("the error is in your pass; rerun with --debug for its traceback")),
    Case("E0203", 2, compile_model(CACHED, "--quantize", "int8"),
         re.escape("method 'forward' takes positions or a cache: it writes 1 buffer (cache); "
                   "static int8 calibrated on the example inputs alone (one call, one "
                   "position) fixes activation ranges that are wrong at every other position, "
                   "and an accuracy measured on the same inputs would not show it"),
         exactly(CalibrationError.default_hint)),
    Case("E0204", 2, compile_model(MLP, "--target", "xnnpack", "--quantize", "int4-weight-only",
                                   "--group-size", "8"),
         re.escape("the weight-only quantized linear layer reading b_fc2_weight_int4 [4, 16] "
                   "cannot run in XNNPACK with its integer weights: its int4 weights are in "
                   "groups of 8") + ".+",
         re.escape("use --quantize 8da4w or 8da8w") + ".+"),
    Case("E0205", 2, run_program(external_weight_program, "--random"),
         re.escape("the program reads 1 tensor from an external data file (w), and none was "
                   "given"), exactly(ExternalDataError.default_hint)),
    Case("E0300", 3, inspect_bytes(b"\x00" * 64),
         re.escape("header: file identifier is b'\\x00\\x00\\x00\\x00', expected b'ET12': ")
         + ".+", exactly(FormatError.default_hint)),
    Case("E0350", 3, run_program(add_constant_program, "--random", "--max-memory", "32"),
         re.escape("the memory plan needs 64 bytes of "
                   "arenas, more than the 32 bytes allowed (the max_memory limit); method "
                   "'forward' alone needs 64 bytes"),
         exactly("if the program is trusted and the memory exists, raise the limit "
                 "(`exirc run --max-memory`, or `load(..., max_memory=...)`)")),
    Case("E0310", 3, compile_model(RAISES),
         re.escape('model.py:4: raise ValueError("no weights here"): ValueError while running '
                   "the model file: no weights here"),
         exactly(ModelError.default_hint)),
    Case("E0311", 3, compile_model(UNBOUNDED),
         r"tensor %x of shape \((s\d+), 3\) needs planned memory, but dimension \1 has no "
         r"upper bound; give it one when exporting: .+",
         exactly('bound every dynamic dimension, e.g. torch.export.Dim("batch", max=64)')),
    Case("E0312", 3, compile_model(MLP, "--max-arena", "64"),
         r"method 'forward' needs a memory arena of (\d+) bytes, over the limit of 64 bytes "
         r"\(lower bound \d+ bytes\); largest planned tensors: %\w+ \[2, 16\] float32 "
         r"128 bytes at model\.py:\d+: .+",
         r".*raise --max-arena"),  # the hint's first half depends on the lower bound
    Case("E0313", 3, compile_model(FAILING_DECOMPOSITION),
         re.escape("torch could not decompose the exported program: RuntimeError: twice has no "
                   "decomposition for this input (the failure is in code torch called, not in "
                   "exirc: torch ") + r"\S+" + re.escape("'s torch.export.ExportedProgram."
                                                       "run_decompositions, at ")
         + r"model\.py:9 in twice_decomposition\)",
         r"a common cause is an in-place write .+register_buffer\(name, tensor, "
         r"persistent=False\).+--debug traceback.+"),
    Case("E0314", 3, compile_model(TWO_LAYOUTS, "--target", "xnnpack-llm"),
         re.escape("the methods read state 'k' in two layouts: [1, 8, 2, 4] ([B, S, H, D] "
                   "for llama ops) and [1, 2, 8, 4] (the model's)"),
         r"the attention over that cache is bound to ExecuTorch's llama ops .+"),
    Case("E0320", 3, with_plugin_pass("retype_mul"),
         re.escape("node %mul: aten::mul.Tensor does not accept dtypes (self: Float, other: "
                   "Float, __ret_0: Long) at model.py:5: return x * y; ") + ".+",
         exactly("cast the inputs (`.to(dtype)`) to a supported combination, or fix the pass "
                 "that made this node (every combination: exirc/edge/dtype_constraints.yaml)")),
    Case("E0330", 3, without_to_edge,
         re.escape("node %linear (aten.linear.default) at model.py:13: "
                   "return self.fc2(torch.relu(self.fc1(x))) [module fc1] is not an Edge op"),
         exactly("the to_edge pass decomposes it into core ATen ops: run to_edge before, and "
                 "check that no later pass made this node (`exirc compile "
                 "--print-ir-after-all`)")),
    Case("E0340", 3, run_program(index_out_of_range_program, "--random"),
         re.escape("while executing instruction 0 (aten::index_select.out) of method "
                   "'forward': IndexError: index out of range in self")
         + r".*" + re.escape("(from model.py:12 in forward: return x[self.rows])"),
         exactly(ExecutionError.default_hint)),
    Case("E0341", 3, run_program(loop_program, "--random", "--max-steps", "5"),
         re.escape("method 'forward' did not finish within 5 instructions (the step limit); "
                   "it was about to run instruction 6 of chain 0: a loop that does not end?"),
         exactly(StepLimitError.default_hint)),
    Case("E0400", 4, run_program(control_flow_program, "--random", "--method", "choose"),
         re.escape("no backend registered for 1 delegate: backend 'ExampleBackend' "
                   "(delegate 0 of method 'choose')"),
         exactly("register kernels with exirc.runtime.register_kernel and backends with "
                 "register_backend, in a module you pass to `exirc run --plugin`")),
    Case("E0400", 4, compile_model(UNSUPPORTED),
         re.escape("target 'portable' cannot run 1 op: aten::avg_pool3d.out (no kernel): "
                   "%avg_pool3d at model.py:5: ") + ".+",
         exactly("register a backend op with a kernel for it, or decompose it into "
                 "supported ops")),
    Case("E0401", 4, compile_model(NOT_EDGE),
         re.escape("operator aten::lgamma is not supported: target 'portable' has no kernel "
                   "for it (aten::lgamma.out), and it has no decomposition into core ATen ops; "
                   "used at model.py:5: return torch.lgamma(x.abs() + 1) [%lgamma]"),
         exactly("register a kernel for aten::lgamma.out (exirc.runtime.register_kernel) in a "
                 "module you pass with --plugin to both `exirc compile` and `exirc run`, or "
                 "change the model to avoid it")),
    Case("E0500", 5, verify_swapped_relu,
         re.escape("method 'forward' differs from eager PyTorch on the example inputs (rtol "
                   "0.0001, atol 1e-05)\n    output_0: max abs error ") + r".+\n"
         + re.escape("    first node a pass changed: %relu, instruction 1 aten::sigmoid.out "
                     "(captured as aten.relu.default)\n"
                     "    source: model.py:13: return self.fc2(torch.relu(self.fc1(x)))\n"
                     "    module: <root> (MLP)\n"
                     "    vs the captured model: max abs error ") + r".+",
         exactly("a pass rewrote %relu into something that computes another value: "
                 "`exirc compile --print-ir-diff` shows which pass changed it")),
]

# Codes no code path in exirc raises yet; a test below fails once one does.
NOT_RAISED_YET = {
    "E0000": "the base class: exirc raises its subclasses",
}


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of passes on sys.path, under a name unique to the test."""
    name = f"exirc_catalogue_plugin_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(PLUGIN + RETYPE_MUL)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.code}-{i}" for i, c in enumerate(CASES)])
def test_each_error_reports_its_code_message_and_hint(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        plugin: str, case: Case) -> None:
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the working directory
    argv = case.argv(tmp_path, plugin)

    exit_code, out, err = run(capsys, *argv)

    assert (exit_code, out) == (case.exit_code, ""), err
    report = REPORT.fullmatch(err)
    assert report is not None, err
    assert report["code"] == case.code
    assert re.fullmatch(case.message, report["message"], re.DOTALL), report["message"]
    assert re.fullmatch(case.hint, report["hint"], re.DOTALL), report["hint"]
    assert CATALOGUE[case.code].exit_code == exit_code


def test_every_code_is_triggered_here_or_not_raised_yet() -> None:
    triggered = {case.code for case in CASES}
    missing = sorted(set(CATALOGUE) - triggered - set(NOT_RAISED_YET))
    assert not missing, f"add a Case to CASES that triggers {missing} through the CLI"
    assert not triggered & set(NOT_RAISED_YET)


@pytest.mark.parametrize("code", sorted(NOT_RAISED_YET))
def test_codes_not_raised_yet_really_are_not(code: str) -> None:
    name = CATALOGUE[code].class_name
    construction = re.compile(rf"(?<![\w.]){name}\(")
    package = Path(exirc.__file__).parent
    for source in package.rglob("*.py"):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if construction.search(line) and not line.lstrip().startswith("class "):
                pytest.fail(f"{source}:{number} raises {name} now: add a Case for {code} "
                            "and remove it from NOT_RAISED_YET")


def test_a_default_hint_fills_in_only_when_the_raise_site_gives_none() -> None:
    assert UsageError("x").hint == UsageError.default_hint
    assert UsageError("x", hint="do this").hint == "do this"


# --------------------------------------------------------------------------
# `exirc explain`.
# --------------------------------------------------------------------------


def test_explain_prints_title_exit_code_and_explanation(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "E0300")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == ["E0300: invalid program file",
                         "exit code: 3 (invalid model or program file)",
                         "raised as: exirc.errors.FormatError",
                         ""]
    assert "checks every offset, length, index" in " ".join(lines)
    for heading in ("Common causes:", "What to do:", "Example:"):
        assert heading in lines
    assert "  - the file was truncated or corrupted while copying" in lines
    assert lines[lines.index("Example:") + 1].startswith("  error[E0300]: header: ")
    assert "\x1b[" not in out  # not a terminal: no colour


@pytest.mark.parametrize("spelling", ["e0300", "0300", "300", "FormatError", "formaterror"])
def test_explain_accepts_other_spellings(capsys: pytest.CaptureFixture[str],
                                         spelling: str) -> None:
    code, out, _ = run(capsys, "explain", spelling)
    assert code == 0 and out.startswith("E0300: invalid program file\n")


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_every_entry_explains_and_fits_a_terminal(capsys: pytest.CaptureFixture[str],
                                                  code: str) -> None:
    exit_code, out, _ = run(capsys, "explain", code)
    assert exit_code == 0
    doc = CATALOGUE[code]
    assert out.startswith(f"{code}: {doc.title}\nexit code: {doc.exit_code} (")
    prose = out[:out.index("\nExample:")]
    assert max(len(line) for line in prose.splitlines()) <= WIDTH
    assert " ".join(doc.causes[0].split()[:4]) in " ".join(prose.split())


def test_explain_is_coloured_on_a_terminal(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, _ = run(capsys, "explain", "E0300")
    assert code == 0
    assert "\x1b[1mE0300: invalid program file\x1b[0m" in out


def test_explain_list_has_every_code_with_its_title(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "--list")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["code", "exit", "title"]
    rows = [line.split(maxsplit=2) for line in lines[1:1 + len(CATALOGUE)]]
    assert rows == [[c, str(CATALOGUE[c].exit_code), CATALOGUE[c].title]
                    for c in sorted(CATALOGUE)]
    assert ["E0300", "3", "invalid program file"] in rows


def test_an_unknown_code_is_a_usage_error_naming_the_closest(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "E0305")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error[E0200]: unknown error code 'E0305'; the closest known: "
        "E0300 (invalid program file), E0310 (model cannot be loaded or exported), "
        "E0311 (dynamic dimension without an upper bound)",
        "  hint: `exirc explain --list` shows every code",
        "  see: exirc explain E0200",
    ]
    code, _, err = run(capsys, "explain", "FormatErr")
    assert code == 2
    assert "the closest known: E0300 (invalid program file)" in err.splitlines()[0]


def test_explain_without_a_code_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "explain")
    assert code == 2
    assert err.startswith("error[E0200]: give an error code, e.g. `exirc explain E0300`")


def test_lookups() -> None:
    assert lookup("E0341") is CATALOGUE["E0341"]
    assert lookup("StepLimitError") is CATALOGUE["E0341"]
    assert lookup("E9999") is None and lookup("nonsense") is None
    assert closest_codes("E0342") == ["E0341", "E0340", "E0350"]  # same family first
    assert closest_codes("E0199") == ["E0100", "E0200", "E0201"]
    assert closest_codes("zzzz") == []


def test_explain_does_not_import_torch() -> None:
    probe = (
        "import sys\n"
        "from exirc.cli.app import main\n"
        "for args in (['explain', 'E0300'], ['explain', '--list'], ['explain', '--help']):\n"
        "    assert main(args) == 0, args\n"
        "assert main(['explain', 'E0999']) == 2\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
