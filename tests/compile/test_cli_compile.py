"""`exirc compile MODEL -o out.pte`: the summary, the flags, the file, the failures.

Every test writes its model file to tmp_path and runs the command in-process
through `exirc.cli.app.main`, as a user's shell would (capsys is the terminal).
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import exirc.compiler
import exirc.serialize.files
from exirc.cli.app import main
from exirc.inspector.memory_report import memory_report
from exirc.inspector.render import human_bytes
from exirc.pipelines import load_pipeline, parse_pipeline
from exirc.serialize import deserialize
from tests.oracle import requires_executorch, run_with_executorch

MLP = """\
import torch

torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


model = MLP().eval()
example_inputs = (torch.randn(2, 8),)
"""

DYNAMIC = """\
import torch


class Pairs(torch.nn.Module):
    def forward(self, x):
        half = x.sum(0, keepdim=True).expand(x.shape[0] // 2, 4)
        return x.view(x.shape[0] * 2, -1) + 1, half * 2


model = Pairs().eval()
example_inputs = (torch.randn(4, 4),)
dynamic_shapes = ({0: torch.export.Dim("batch", min=4, max=16)},)
"""

# fc1: 16x8 + 16 floats, fc2: 4x16 + 4 floats.
MLP_CONSTANT_BYTES = (16 * 8 + 16 + 4 * 16 + 4) * 4


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compile", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def eager(model_file: Path, method: str = "forward", factory: str | None = None,
          inputs: tuple[Any, ...] | None = None) -> tuple[list[torch.Tensor], tuple[Any, ...]]:
    """Eager outputs of the model file (run afresh, so seeded weights match)."""
    names = runpy.run_path(str(model_file))
    if factory is not None:
        module, example = names[factory]()[:2]
    elif method == "forward":
        module, example = names["model"], names["example_inputs"]
    else:
        module, example = names["methods"][method][:2]
    module.eval()
    args = inputs if inputs is not None else example
    with torch.no_grad():
        out = module(*args)
    return (list(out) if isinstance(out, (tuple, list)) else [out]), args


def operators(pte: Path, method: str = "forward") -> list[str]:
    program = deserialize(pte.read_bytes())
    (plan,) = [p for p in program.execution_plan if p.name == method]
    return [op.qualified_name for op in plan.operators]


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


# --------------------------------------------------------------------------
# Success.
# --------------------------------------------------------------------------


def test_success_prints_the_summary_on_stderr_only(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    pte = tmp_path / "out.pte"

    code, out, err = run(capsys, str(model), "-o", str(pte))

    assert code == 0, err
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.py", "out.pte"]
    data = pte.read_bytes()
    program = deserialize(data)
    (plan,) = program.execution_plan
    instructions = sum(len(chain.instructions) for chain in plan.chains)
    lines = err.splitlines()
    assert len(lines) == 5, err
    assert lines[0] == f"compiled {model} -> {pte} ({human_bytes(len(data))}), target portable"
    stages = re.findall(r"(\w+) (\d+\.\d\d) s", lines[1])
    assert lines[1].startswith("  stages: ")
    assert [name for name, _ in stages] == ["capture", "aten", "edge", "backend", "plan",
                                           "emit", "serialize", "load_check"]
    assert lines[2] == f"  {instructions} instructions, 3 kernel calls"  # addmm, relu, addmm
    # The same arena, peak and fragmentation as `inspect --show memory` shows.
    (method,) = memory_report(program)
    (arena,) = method.arenas
    assert arena.size == sum(plan.non_const_buffer_sizes) and 0 < arena.peak_bytes <= arena.size
    assert lines[3] == (f"  arena {arena.size} B, peak live {arena.peak_bytes} B, fragmentation "
                        f"{100 * arena.fragmentation:.1f}% (as `exirc inspect --show memory`)")
    assert main(["inspect", str(pte), "--show", "memory"]) == 0
    shown = capsys.readouterr().out
    assert f"    size           {arena.size} B" in shown
    assert f"    fragmentation  {100 * arena.fragmentation:.1f}% " in shown
    assert lines[4] == f"  constants {human_bytes(MLP_CONSTANT_BYTES)}"  # permutes folded


def test_quiet_prints_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    code, out, err = run(capsys, str(model), "-o", str(tmp_path / "out.pte"), "-q")
    assert code == 0
    assert (out, err) == ("", "")
    assert (tmp_path / "out.pte").stat().st_size > 0


def test_quiet_prints_nothing_in_a_real_process(tmp_path: Path) -> None:
    # In-process, pytest records Python warnings before they reach the terminal;
    # a user's shell sees torch's warnings, so run the command as the user does.
    model = write(tmp_path, "pairs.py", DYNAMIC)
    done = subprocess.run([sys.executable, "-m", "exirc", "compile", str(model), "-q"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    assert (tmp_path / "pairs.pte").exists()


def test_verbose_lists_each_methods_operators(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    pte = tmp_path / "out.pte"
    code, out, err = run(capsys, str(model), "-o", str(pte), "-v")
    assert code == 0
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 6
    (plan,) = deserialize(pte.read_bytes()).execution_plan
    assert lines[5] == (f"  method forward: {len(plan.values)} values, 2 operators: "
                        "aten::addmm.out, aten::relu.out")


@requires_executorch
def test_the_program_runs_on_executorch_like_eager(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    pte = tmp_path / "out.pte"
    assert run(capsys, str(model), "-o", str(pte), "-q")[0] == 0
    expected, inputs = eager(model, inputs=(torch.randn(2, 8),))
    got = run_with_executorch(pte.read_bytes(), inputs)
    assert len(got) == 1
    torch.testing.assert_close(got[0], expected[0])




@requires_executorch
def test_size_arithmetic_under_dynamic_shapes_compiles_and_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = write(tmp_path, "pairs.py", DYNAMIC)
    pte = tmp_path / "pairs.pte"

    code, _, err = run(capsys, str(model), "-o", str(pte), "-v")

    assert code == 0, err
    ops = operators(pte)
    assert "executorch_prim::mul.Scalar" in ops and "executorch_prim::floordiv.Scalar" in ops
    for batch in (4, 7, 16):
        expected, inputs = eager(model, inputs=(torch.randn(batch, 4),))
        got = run_with_executorch(pte.read_bytes(), inputs)
        assert [g.shape for g in got] == [e.shape for e in expected]
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("target", ["portable", "exirc"])
def test_print_pipeline_prints_yaml_on_stdout(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, target: str) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    code, out, err = run(capsys, str(model), "--print-pipeline", "--target", target)
    assert code == 0
    assert err == ""
    assert yaml.safe_load(out)["target"] == target
    assert parse_pipeline(out, "printed").stages == load_pipeline(target).stages
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.py"]  # nothing compiled


def test_print_pipeline_shows_a_pipeline_file(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    custom = write(tmp_path, "p.yaml", """\
        target: exirc
        stages:
          edge: [to_edge, views_to_copies, {constant_fold: {max_bytes: 64}}]
        """)
    code, out, _ = run(capsys, "unused.py", "--pipeline", str(custom), "--print-pipeline")
    assert code == 0
    assert out.startswith(f"# pipeline from {custom}\n")
    data = yaml.safe_load(out)
    assert data["stages"]["edge"] == [{"to_edge": {"keep": []}}, "views_to_copies",
                                      {"constant_fold": {"max_bytes": 64}}]
    assert data["stages"]["plan"] == []


def test_target_exirc_fuses_linear_relu(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    pte = tmp_path / "fast.pte"
    code, _, err = run(capsys, str(model), "-o", str(pte), "--target", "exirc", "-v")
    assert code == 0, err
    assert operators(pte) == ["exirc::addmm_relu.out", "aten::addmm.out"]  # in call order
    assert "target exirc" in err.splitlines()[0]
    assert "  2 instructions, 2 kernel calls" in err.splitlines()
    assert err.splitlines()[-1].endswith("2 operators: aten::addmm.out, exirc::addmm_relu.out")

    code, _, _ = run(capsys, str(model), "-o", str(tmp_path / "portable.pte"), "-q")
    assert code == 0
    assert "exirc::addmm_relu.out" not in operators(tmp_path / "portable.pte")


# --------------------------------------------------------------------------
# Failures: exit code, one line, and no file.
# --------------------------------------------------------------------------

RAISES = """\
import torch

def build():
    raise ValueError("no weights here")

model = build()
example_inputs = (torch.randn(2, 3),)
"""

UNSUPPORTED = """\
import torch

class Pool3d(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.avg_pool3d(x, 2) + 1

model = Pool3d().eval()
example_inputs = (torch.randn(1, 1, 4, 4, 4),)
"""

NOT_EDGE = """\
import torch

class LogGamma(torch.nn.Module):
    def forward(self, x):
        return torch.lgamma(x.abs() + 1)

model = LogGamma().eval()
example_inputs = (torch.randn(2, 3),)
"""

FAILURES = {
    "raises": (RAISES, [], 3,
               "error[E0310]: model.py:4: raise ValueError(\"no weights here\"): ValueError "
               "while running the model file: no weights here"),
    "unsupported": (UNSUPPORTED, [], 4,
                    "error[E0400]: target 'portable' cannot run 1 op: aten::avg_pool3d.out "
                    "(no kernel): %avg_pool3d at model.py:5: "),
    "not_edge": (NOT_EDGE, [], 4, "error[E0401]: operator aten::lgamma is not supported: "
                                  "target 'portable' has no kernel for it (aten::lgamma.out)"),
    "bad_pipeline": (MLP, ["--pipeline", "bad.yaml"], 2,
                     "error[E0200]: bad.yaml: unknown stage(s) ['optimize']"),
}


@pytest.mark.parametrize(("case", "previous"),
                         [(case, b"an earlier program") for case in FAILURES] +
                         [("raises", None), ("unsupported", None)])
def test_a_failing_compile_leaves_no_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, case: str,
                                          previous: bytes | None) -> None:
    source, extra, exit_code, message = FAILURES[case]
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the working directory
    write(tmp_path, "model.py", source)
    write(tmp_path, "bad.yaml", "stages:\n  optimize: [to_edge]\n")
    pte = tmp_path / "model.pte"
    if previous is not None:
        pte.write_bytes(previous)
        os.utime(pte, (1_000_000_000, 1_000_000_000))
    before = listing(tmp_path)

    code, out, err = run(capsys, "model.py", "-o", "model.pte", *extra)

    assert code == exit_code, err
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith(message), lines[0]
    assert len(lines) == 3 and lines[1].startswith("  hint: "), err
    assert lines[2] == "  see: exirc explain " + message.split("]")[0].removeprefix("error[")
    assert "Traceback" not in err
    assert listing(tmp_path) == before  # no new file, no temp file, the old one untouched
    if previous is None:
        assert not pte.exists()
    else:
        assert pte.stat().st_mtime == 1_000_000_000


def test_the_output_is_written_atomically(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    pte = tmp_path / "out.pte"
    pte.write_bytes(b"old")
    renames: list[tuple[Path, Path, bytes, bytes]] = []
    real_replace = os.replace

    def spy(source: str, destination: Path) -> None:
        # At the rename, the new program is complete and the old file untouched.
        renames.append((Path(source), Path(destination), Path(source).read_bytes(),
                        Path(destination).read_bytes()))
        real_replace(source, destination)

    monkeypatch.setattr(exirc.serialize.files.os, "replace", spy)
    code, _, err = run(capsys, str(model), "-o", str(pte), "-q")

    assert code == 0, err
    ((source, destination, new, old),) = renames
    assert destination == pte
    assert source.parent == pte.parent  # same directory: the rename is atomic
    assert source.name.startswith(".out.pte.") and source.name.endswith(".tmp")
    assert new == pte.read_bytes() and new[4:8] == b"ET12"
    assert old == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.py", "out.pte"]


# A full disk is the user's to fix: a usage error naming the file (exit 2), not a bug.
@pytest.mark.parametrize(("failure", "exit_code"), [(OSError(28, "No space left on device"), 2),
                                                    (KeyboardInterrupt(), 130)])
def test_a_failed_write_keeps_the_old_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           failure: BaseException, exit_code: int) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    pte = tmp_path / "out.pte"
    pte.write_bytes(b"old")

    def fail(fd: int) -> None:
        raise failure

    monkeypatch.setattr(exirc.serialize.files.os, "fsync", fail)
    code, out, err = run(capsys, str(model), "-o", str(pte), "-q")

    assert code == exit_code
    assert out == ""
    if exit_code == 2:
        assert f"{pte}: cannot write: No space left on device" in err
    assert pte.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.py", "out.pte"]  # no temp file


CREATES = """\
import torch

class Creates(torch.nn.Module):
    def forward(self, x):
        return x + torch.ones(2, 3), x + torch.arange(3)

model = Creates().eval()
example_inputs = (torch.randn(2, 3),)
"""


def test_tensor_factories_compile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = write(tmp_path, "creates.py", CREATES)
    code, _, err = run(capsys, str(model), "-q")
    assert code == 0, err


def test_an_output_in_a_missing_directory_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = write(tmp_path, "mlp.py", MLP)
    code, _, err = run(capsys, str(model), "-o", str(tmp_path / "no" / "such" / "out.pte"))
    assert code == 2
    assert err.startswith("error[E0200]: ") and "please report" not in err


# --------------------------------------------------------------------------
# What MODEL can name.
# --------------------------------------------------------------------------


def test_default_output_is_the_model_stem_with_pte(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write(models, "net.v2.py", MLP)
    monkeypatch.chdir(tmp_path)

    code, _, err = run(capsys, "models/net.v2.py")

    assert code == 0, err
    assert err.splitlines()[0].startswith("compiled models/net.v2.py -> models/net.v2.pte (")
    assert sorted(p.name for p in models.iterdir()) == ["net.v2.pte", "net.v2.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


FACTORY = """\
import torch

class Affine(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x) * self.scale

def build():
    torch.manual_seed(3)
    return Affine(0.5).eval(), (torch.randn(4, 3),)

def broken():
    raise RuntimeError("factory failed")
"""


@requires_executorch
def test_a_factory_names_the_module(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = write(tmp_path, "net.py", FACTORY)

    code, _, err = run(capsys, f"{model}:build")

    assert code == 0, err
    pte = tmp_path / "net.pte"  # the default name drops `:build`
    assert err.splitlines()[0].startswith(f"compiled {model}:build -> {pte} (")
    expected, inputs = eager(model, factory="build")
    got = run_with_executorch(pte.read_bytes(), inputs)
    torch.testing.assert_close(got[0], expected[0])

    code, _, err = run(capsys, f"{model}:broken", "-o", str(tmp_path / "b.pte"))
    assert code == 3
    assert "RuntimeError while calling broken(): factory failed" in err
    assert not (tmp_path / "b.pte").exists()


METHODS = """\
import torch

torch.manual_seed(1)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Decoder(torch.nn.Module):
    def forward(self, h, scale):
        return h * scale + 1, h.sum(dim=-1)


model = Encoder().eval()
example_inputs = (torch.randn(2, 4),)
methods = {"decode": (Decoder(), (torch.randn(2, 3), torch.randn(3)))}
"""


@requires_executorch
def test_methods_become_execution_plans(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    model = write(tmp_path, "codec.py", METHODS)
    pte = tmp_path / "codec.pte"

    code, _, err = run(capsys, str(model), "-o", str(pte), "-v")

    assert code == 0, err
    program = deserialize(pte.read_bytes())
    assert [p.name for p in program.execution_plan] == ["forward", "decode"]
    method_lines = [line for line in err.splitlines() if line.startswith("  method ")]
    assert [line.split(":")[0] for line in method_lines] == ["  method forward",
                                                            "  method decode"]
    assert "aten::tanh.out" in operators(pte, "forward")
    assert "aten::tanh.out" not in operators(pte, "decode")
    for method in ("forward", "decode"):
        expected, inputs = eager(model, method)
        got = run_with_executorch(pte.read_bytes(), inputs, method=method)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e)


TRAINING = """\
import torch

torch.manual_seed(2)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.drop = torch.nn.Dropout(0.5)
        self.norm = torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return self.norm(self.drop(self.fc(x)))


model = Net()
example_inputs = (torch.randn(4, 6),)
"""


@requires_executorch
def test_a_model_in_training_mode_warns_and_compiles_in_eval_mode(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = write(tmp_path, "net.py", TRAINING)
    pte = tmp_path / "net.pte"

    code, out, err = run(capsys, str(model), "-o", str(pte))

    assert code == 0, err
    assert out == ""
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    line = TRAINING.splitlines().index("model = Net()") + 1
    assert warnings == [f"warning: {model}:{line}: `model` is in training mode; compiling it in "
                        "eval mode (call .eval() on it to silence this warning)"]
    assert any(line.startswith(f"compiled {model} -> ") for line in err.splitlines())
    ops = operators(pte)
    assert not any("dropout" in op or "bernoulli" in op or "rand" in op for op in ops), ops
    expected, inputs = eager(model)  # eval mode: no dropout, running batch-norm statistics
    got = run_with_executorch(pte.read_bytes(), inputs)
    torch.testing.assert_close(got[0], expected[0])
