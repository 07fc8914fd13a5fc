"""`exirc compile --verify`: the program against eager PyTorch, and where they part.

A wrong kernel is injected into the interpreter through a kernel registry
(the API's `kernels=`), and verification must name the first instruction it
runs, its op, node, source line and module. Through the command line, a
pipeline plugin pass that changes the model's semantics must fail the
compile with exit code 5 and no file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from exirc.capture import MethodSource, load_model
from exirc.cli.app import main
from exirc.compiler import CompileOptions, CompileResult, compile_model
from exirc.diagnostics.compare import Tolerance, compare
from exirc.diagnostics.divergence import CAPTURED, PLANNED
from exirc.diagnostics.eager_check import VerificationReport, verify_compiled
from exirc.errors import UsageError, VerificationError
from exirc.runtime import load
from exirc.runtime.kernels.registry import KERNELS, KernelRegistry
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.compile.test_cli_compile import write
from tests.passes.test_pipeline import PLUGIN, portable_with
from tests.plugin_modules import plugin_module
from tests.programs import add_constant_program

NET = """\
import torch

torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.block(x))


model = Net().eval()
example_inputs = (torch.randn(2, 8),)
"""

GATE = """\
import torch
from torch._higher_order_ops.map import map as map_rows


class Gate(torch.nn.Module):
    def forward(self, x):
        def grow(t):
            return t * 2

        def shrink(t):
            return t.abs() - 1

        y = torch.cond(x.sum() > 0, grow, shrink, (x,))
        return map_rows(lambda row: row.tanh() + 1, y)


model = Gate().eval()
example_inputs = (torch.ones(2, 3),)
"""


def line_of(source: str, code: str) -> str:
    """`model.py:12: code`, as reports show a line of a model file written to the cwd."""
    number = [line.strip() for line in source.splitlines()].index(code) + 1
    return f"model.py:{number}: {code}"


def registry(op: str, kernel: Callable[..., Any]) -> KernelRegistry:
    """The default kernels, with `op`'s replaced by `kernel`."""
    kernels = KernelRegistry(parent=KERNELS)
    kernels.register(op, kernel)
    return kernels


def leaky_relu(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """Not relu: negative inputs leak through."""
    return torch.where(x > 0, x, 0.1 * x, out=out)


def add_not_mul(x: torch.Tensor, y: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return torch.add(x, y, out=out)


def neg_not_abs(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return torch.neg(x, out=out)


def sigmoid_not_tanh(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x, out=out)


def index_of(result: CompileResult, op: str) -> int:
    """The index of the (only) instruction calling `op` in forward's chain."""
    plan = result.program.method("forward")
    names = [plan.operators[i.op_index].qualified_name if isinstance(i, P.KernelCall) else ""
             for i in plan.chains[0].instructions]
    assert names.count(op) == 1, names
    return names.index(op)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CompileResult, Path]]:
    """NET compiled (no verification) from a model.py in its own directory, which is
    the working directory while the tests using it run."""
    directory = tmp_path_factory.mktemp("net")
    write(directory, "model.py", NET)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        yield compile_model("model.py"), directory


@pytest.fixture()
def in_net_dir(net: tuple[CompileResult, Path], monkeypatch: pytest.MonkeyPatch
               ) -> CompileResult:
    monkeypatch.chdir(net[1])
    return net[0]


# --------------------------------------------------------------------------
# Success.
# --------------------------------------------------------------------------


def test_verify_passes_and_prints_the_max_error(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    write(tmp_path, "model.py", NET)
    pte = tmp_path / "model.pte"

    code = main(["compile", str(tmp_path / "model.py"), "--verify", "-o", str(pte)])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == ""
    verified = err.splitlines()[-1]
    assert verified.startswith("verified: 1 output matches eager PyTorch (max abs error ")
    assert verified.endswith("; rtol 0.0001, atol 1e-05)")
    assert "| eager " in err and "| verify " in err  # their own stages in the timings
    assert pte.exists()
    code = main(["compile", str(tmp_path / "model.py"), "--verify", "-q", "-o", str(pte)])
    assert (code, capsys.readouterr()) == (0, ("", ""))


def test_the_report_of_a_match(in_net_dir: CompileResult) -> None:
    report = verify_compiled(in_net_dir, load_model("model.py").methods)
    assert report.ok and report.outputs_compared == 1
    assert report.max_abs < 1e-5
    (case,) = report.cases
    assert case.case.origin == "example inputs" and case.divergence is None


# --------------------------------------------------------------------------
# A wrong kernel: the first diverging instruction, its source and module.
# --------------------------------------------------------------------------


def test_a_wrong_kernel_is_localized_to_its_instruction(in_net_dir: CompileResult) -> None:
    result = in_net_dir
    report = verify_compiled(result, load_model("model.py").methods,
                             kernels=registry("aten::relu.out", leaky_relu))

    assert not report.ok
    (case,) = report.cases
    assert [i for i, d in case.outputs if not d.ok] == [0]
    divergence = case.divergence
    assert divergence is not None
    assert divergence.against == PLANNED
    assert divergence.instruction == index_of(result, "aten::relu.out")
    assert divergence.op == "aten::relu.out"
    assert divergence.node == "relu"
    assert divergence.source == line_of(NET, "return torch.relu(self.fc(x))")
    assert divergence.module == "block (Block)"
    assert divergence.loop is None and divergence.execution == 1
    # The worst element is one relu zeroes and the leaky kernel does not.
    assert divergence.difference.expected == 0 and divergence.difference.actual < 0
    assert divergence.actual.startswith("[") and divergence.expected.startswith("[")


def test_compile_with_verify_raises_with_the_localization(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", NET)

    with pytest.raises(VerificationError) as raised:
        compile_model("model.py", CompileOptions(verify=True),
                      kernels=registry("aten::relu.out", leaky_relu))

    lines = raised.value.message.splitlines()
    assert lines[0] == ("method 'forward' differs from eager PyTorch on the example inputs "
                        "(rtol 0.0001, atol 1e-05)")
    assert lines[1].startswith("    output_0: max abs error ")
    assert lines[2:5] == [
        "    first diverging instruction: 1 aten::relu.out (node %relu)",
        f"    source: {line_of(NET, 'return torch.relu(self.fc(x))')}",
        "    module: block (Block)",
    ]
    assert lines[5].startswith("    vs torch's kernels on the same inputs: max abs error ")
    assert lines[6].startswith("    got      [") and lines[7].startswith("    expected [")
    assert raised.value.hint == ("instruction 1 (aten::relu.out) computes something else than "
                                 "torch's kernel on the same inputs: check the kernel "
                                 "registered for it (a plugin?) or the interpreter")
    assert raised.value.exit_code == 5


def test_cond_branches_are_verified_each_on_its_own_inputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", GATE)
    # A negative sum (the false branch), with positives where neg differs from abs.
    negative = numpy.array([[-3, 1, -1], [-1, -1, 1]], numpy.float32)
    numpy.savez(tmp_path / "negative.npz", input_0=negative)
    result = compile_model("model.py")
    sources = load_model("model.py").methods
    both = ["negative.npz"]

    def verify(kernels: KernelRegistry | None = None,
               files: list[str] | None = None) -> VerificationReport:
        report = verify_compiled(result, sources, input_files=files or [], kernels=kernels)
        return report

    assert verify().ok and verify(files=both).ok  # true branch, then false branch

    # A wrong mul (true branch only): the example inputs find it, the negative ones cannot.
    wrong_mul = registry("aten::mul.out", add_not_mul)
    assert verify(wrong_mul, both).ok
    divergence = verify(wrong_mul).cases[0].divergence
    assert divergence is not None
    assert (divergence.instruction, divergence.op, divergence.node) == (
        index_of(result, "aten::mul.out"), "aten::mul.out", "mul")
    assert divergence.source == line_of(GATE, "y = torch.cond(x.sum() > 0, grow, shrink, (x,))")
    assert divergence.module == "<root> (Gate)" and divergence.loop is None

    # A wrong abs (false branch only): the other way round.
    wrong_abs = registry("aten::abs.out", neg_not_abs)
    assert verify(wrong_abs).ok
    report = verify(wrong_abs, both)
    (case,) = report.cases
    assert case.case.origin == "negative.npz" and not case.ok
    assert case.divergence is not None and case.divergence.node == "abs_1"
    assert case.divergence.instruction == index_of(result, "aten::abs.out")
    assert report.failure_message().startswith(
        "method 'forward' differs from eager PyTorch on negative.npz (")


def test_a_divergence_inside_a_loop_names_the_loop(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", GATE)
    result = compile_model("model.py")

    report = verify_compiled(result, load_model("model.py").methods,
                             kernels=registry("aten::tanh.out", sigmoid_not_tanh))

    divergence = report.cases[0].divergence
    assert divergence is not None
    assert (divergence.op, divergence.node, divergence.execution) == ("aten::tanh.out", "tanh", 1)
    assert divergence.instruction == index_of(result, "aten::tanh.out")
    map_line = line_of(GATE, "return map_rows(lambda row: row.tanh() + 1, y)")
    assert divergence.loop == f"%map_impl at {map_line}"
    assert "    inside the loop %map_impl at model.py:14: " in report.failure_message()


def test_a_loop_that_a_wrong_kernel_makes_endless_is_still_localized() -> None:
    from torch._higher_order_ops.while_loop import while_loop

    from exirc.compiler import compile_module

    class Halve(torch.nn.Module):
        """Halve until small: with an abs that returns ones, the loop never ends."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            def more(y: torch.Tensor) -> torch.Tensor:
                return y.abs().sum() > 1

            def step(y: torch.Tensor) -> tuple[torch.Tensor]:
                return (y * 0.5,)

            return while_loop(more, step, (x,))[0]

    x = torch.full((3,), 4.0)
    result = compile_module(Halve(), (x,))
    source = MethodSource("forward", Halve(), (x,), None, None, "<module>")
    report = verify_compiled(result, {"forward": source},
                             kernels=registry("aten::abs.out", lambda t, *, out: torch.add(
                                 t * 0, 1, out=out)), max_steps=10_000)

    (case,) = report.cases
    assert case.problem.startswith("the program fails where eager PyTorch does not: method "
                                   "'forward' did not finish within 10000 instructions")
    assert case.divergence is not None and case.divergence.op == "aten::abs.out"
    assert case.divergence.loop is not None and case.divergence.loop.startswith("%while_loop")


# --------------------------------------------------------------------------
# A pass that changes the semantics, through the command line.
# --------------------------------------------------------------------------


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from plugin_module(tmp_path, monkeypatch, PLUGIN, "exirc_verify_plugin")


def test_a_pass_that_changes_the_result_fails_the_compile_with_exit_5(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        plugin: str) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", NET)
    write(tmp_path, "swap.yaml", portable_with([f"{plugin}:SwapRelu"]))  # relu -> sigmoid

    code = main(["compile", "model.py", "--pipeline", "swap.yaml", "--verify", "--bundle",
                 "-o", "model.pte"])

    out, err = capsys.readouterr()
    assert (code, out) == (5, "")
    assert not (tmp_path / "model.pte").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.pte")]
    lines = err.splitlines()
    assert lines[0] == ("error[E0500]: method 'forward' differs from eager PyTorch on the "
                        "example inputs (rtol 0.0001, atol 1e-05)")
    assert lines[2:5] == [
        "    first node a pass changed: %relu, instruction 1 aten::sigmoid.out (captured as "
        "aten.relu.default)",
        f"    source: {line_of(NET, 'return torch.relu(self.fc(x))')}",
        "    module: block (Block)",
    ]
    assert lines[-2] == ("  hint: a pass rewrote %relu into something that computes another "
                         "value: `exirc compile --print-ir-diff` shows which pass changed it")
    assert lines[-1] == "  see: exirc explain E0500"


def test_the_pass_case_through_the_api_is_a_captured_divergence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin: str) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", NET)
    write(tmp_path, "swap.yaml", portable_with([f"{plugin}:SwapRelu"]))
    result = compile_model("model.py", CompileOptions(pipeline="swap.yaml"))

    report = verify_compiled(result, load_model("model.py").methods)

    divergence = report.cases[0].divergence
    assert divergence is not None and divergence.against == CAPTURED
    assert (divergence.node, divergence.op, divergence.captured_op) == (
        "relu", "aten::sigmoid.out", "aten.relu.default")


# --------------------------------------------------------------------------
# Options.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("args, code, message", [
    (["--verify-inputs", "in.npz"], "E0200",
     "verification inputs apply to --verify, --bundle and --quantize"),
    (["--atol", "1e-3"], "E0200", "--rtol and --atol apply to --verify and --bundle"),
    (["--verify", "--rtol", "-1"], "E0200",
     "tolerances must be >= 0, got rtol -1.0, atol 1e-05"),
    (["--verify", "--verify-inputs", "in.npy"], "E0200",
     "in.npy: verification inputs are a .npz file"),
    (["--verify", "--verify-inputs", "keys.npz"], "E0200", "keys.npz: unexpected key 'x'"),
    (["--verify", "--verify-inputs", "f64.npz"], "E0200",
     "f64.npz: input_0 of method 'forward' is float64[2, 8], but the example input is "
     "float32[2, 8]"),
    (["--verify", "--verify-inputs", "wide.npz"], "E0201",
     "wide.npz: x has shape [3, 8], expected [2, 8] (f32[2, 8])"),
])
def test_bad_verification_options_are_usage_errors(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        args: list[str], code: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", NET)
    numpy.save(tmp_path / "in.npy", numpy.zeros((2, 8), numpy.float32))
    numpy.savez(tmp_path / "keys.npz", x=numpy.zeros((2, 8), numpy.float32))
    numpy.savez(tmp_path / "f64.npz", input_0=numpy.zeros((2, 8)))
    numpy.savez(tmp_path / "wide.npz", input_0=numpy.zeros((3, 8), numpy.float32))

    exit_code = main(["compile", "model.py", *args, "-o", "model.pte"])

    err = capsys.readouterr().err
    assert exit_code == 2, err
    assert err.startswith(f"error[{code}]: {message}\n"), err
    assert not (tmp_path / "model.pte").exists()


def test_tolerances_loosen_the_check(in_net_dir: CompileResult) -> None:
    sources = load_model("model.py").methods
    tiny_change = registry("aten::relu.out", lambda x, *, out: torch.add(
        torch.relu(x), 1e-3, out=out))
    assert not verify_compiled(in_net_dir, sources, kernels=tiny_change).ok
    assert verify_compiled(in_net_dir, sources, kernels=tiny_change,
                           tolerance=Tolerance(atol=1e-2)).ok


# --------------------------------------------------------------------------
# The pieces: comparison rules, the interpreter's observer hook.
# --------------------------------------------------------------------------

TOLERANCE = Tolerance()


def test_compare_numbers_within_tolerance() -> None:
    expected = torch.tensor([1.0, 2.0, 0.0])
    assert compare(expected + 1e-6, expected, TOLERANCE).ok
    difference = compare(torch.tensor([1.0, 2.5, 0.0]), expected, TOLERANCE)
    assert not difference.ok
    assert (difference.at, difference.actual, difference.expected) == ((1,), 2.5, 2.0)
    assert difference.max_abs == 0.5 and difference.mismatched == 1 and difference.count == 3
    assert difference.describe() == ("max abs error 0.5 (rel 0.25) at [1]: got 2.5, expected "
                                     "2; 1 of 3 elements differ")


def test_compare_nan_and_infinities() -> None:
    nan, inf = math.nan, math.inf
    expected = torch.tensor([nan, inf, -inf, 1.0])
    assert compare(expected.clone(), expected, TOLERANCE).ok  # NaN in the same places
    moved = compare(torch.tensor([1.0, inf, -inf, nan]), expected, TOLERANCE)
    assert not moved.ok and moved.max_abs == inf and moved.mismatched == 2
    assert not compare(torch.tensor([nan, -inf, -inf, 1.0]), expected, TOLERANCE).ok


def test_compare_dtypes_shapes_and_scalars() -> None:
    x = torch.zeros(2, 3)
    assert compare(x.double(), x, TOLERANCE).describe() == "dtype float64, expected float32"
    assert compare(x.reshape(3, 2), x, TOLERANCE).describe() == "shape [3, 2], expected [2, 3]"
    assert not compare(torch.tensor([1, 2]), torch.tensor([1, 3]), TOLERANCE).ok  # ints: exact
    assert compare(3, 3, TOLERANCE).ok and not compare(3, 4, TOLERANCE).ok
    assert compare(numpy.zeros((2, 3), numpy.float32), x, TOLERANCE).ok
    assert compare([x, 1], [x, 1], TOLERANCE).ok
    assert compare([x], [x, x], TOLERANCE).describe() == "1 items, expected 2"


def test_the_observer_sees_every_instruction_in_order() -> None:
    program = add_constant_program()
    program.execution_plan[0].chains[0].instructions.append(P.FreeCall(0))
    program.execution_plan[0].chains[0].stacktrace.append(P.FrameList())
    method = load(serialize(program)).method("forward")
    seen: list[tuple[int, int, float]] = []
    output = method.output_values[0]

    (out,) = method.run([torch.ones(2, 3)], observer=lambda chain, index: seen.append(
        (chain, index, float(method.value(output).sum()))))

    assert [(c, i) for c, i, _ in seen] == [(0, 0), (0, 1)]
    assert seen[0][2] == float(out.sum())  # read right after the instruction wrote it
    assert torch.equal(method.run([torch.ones(2, 3)])[0], out)  # and runs without one too


def test_verify_compiled_takes_sources_from_compile_module() -> None:
    from exirc.compiler import compile_module

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()).eval()
    x = torch.randn(4, 3)
    result = compile_module(model, (x,), options=CompileOptions(verify=True, bundle=True))
    assert result.verification is not None and result.verification.ok
    assert result.bundled_cases == 1
    with pytest.raises(UsageError, match="verification inputs apply to --verify"):
        compile_module(model, (x,), options=CompileOptions(verify_inputs=("x.npz",)))
