"""What each command imports before its first output, and that it prints only its own.

`exirc --version`, `--help` and `inspect` never need torch (nor torchao,
which a model's imports may bring): they start in a fraction of the time.
`exirc run` on a small program needs torch, but not what torch's Python meta
kernels import (torch._dynamo, sympy), nor the optional engines a portable
program does not use. Each check reads `sys.modules` in a fresh interpreter;
none times anything (`make bench` measures the start-up).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import exirc
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program

REPO = Path(__file__).resolve().parents[2]

# Runs `main(argv[2:])` and prints, as its last line, which of the modules
# named in argv[1] (comma-separated) had been imported by then.
PROBE = """
import sys
from exirc.cli.app import main
code = main(sys.argv[2:])
print()
print(code, sorted(name for name in sys.argv[1].split(",") if name in sys.modules))
"""

NOT_WITHOUT_A_MODEL = ("torch", "torchao")
NOT_FOR_A_SMALL_PROGRAM = ("torch._dynamo", "sympy", "torchao", "onnx", "onnxruntime",
                           "ai_edge_litert")


def imported_by(watched: tuple[str, ...], *args: str) -> tuple[int, list[str]]:
    """(exit code, which of `watched` were imported) for `exirc *args`."""
    run = subprocess.run([sys.executable, "-c", PROBE, ",".join(watched), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    code, _, modules = run.stdout.splitlines()[-1].partition(" ")
    return int(code), ast.literal_eval(modules)


@pytest.fixture(scope="module")
def add_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("start_up") / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


@pytest.fixture(scope="module")
def mlp_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mlp.py: the small program of the start-up figures."""
    path = tmp_path_factory.mktemp("start_up") / "mlp.pte"
    exirc.compile(REPO / "examples" / "mlp.py", output=path, target="portable")
    return path


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["inspect", "{pte}"],
                                  ["inspect", "{pte}", "--json"],
                                  ["inspect", "{pte}", "--show", "instructions"]])
def test_version_help_and_inspect_import_neither_torch_nor_torchao(add_pte: Path,
                                                                    args: list[str]) -> None:
    code, imported = imported_by(NOT_WITHOUT_A_MODEL, *(a.format(pte=add_pte) for a in args))
    assert (code, imported) == (0, [])


def test_run_on_a_small_program_imports_only_what_it_runs_on(mlp_pte: Path) -> None:
    code, imported = imported_by(NOT_FOR_A_SMALL_PROGRAM, "run", str(mlp_pte), "--random")
    assert (code, imported) == (0, [])


def test_the_probe_sees_an_import(add_pte: Path) -> None:
    """The probe is not blind: `run` imports torch, which it watches here."""
    code, imported = imported_by(("torch",), "run", str(add_pte), "--random")
    assert (code, imported) == (0, ["torch"])


@pytest.mark.parametrize("args", [["run", "{pte}", "--random"], ["inspect", "{pte}"],
                                  ["--version"]])
def test_a_command_prints_nothing_on_stderr_but_its_own(mlp_pte: Path, args: list[str]) -> None:
    """No third-party warnings or logging (torch's, numpy's, an engine's)."""
    run = subprocess.run([sys.executable, "-m", "exirc", *(a.format(pte=mlp_pte) for a in args)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout and run.stderr == ""
