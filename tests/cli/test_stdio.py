"""`-` as stdin and stdout: `compile -o -`, `run -o -`, `inspect -`, through the
real CLI in a subprocess (stdout a pipe, or a pseudo-terminal for the refusals)."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest

from exirc.serialize import deserialize
from exirc.serialize.writer import serialize
from tests import warm_exirc
from tests.cli.tiny_model import TINY_MODEL
from tests.programs import add_constant_program


def exirc(*args: str, stdin: bytes | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """The CLI with stdout and stderr as pipes (bytes: stdout may be binary)."""
    return warm_exirc.exirc(args, input=stdin, timeout=120, cwd=cwd,
                            env={**os.environ, "NO_COLOR": "1"})


def exirc_on_terminal(*args: str) -> tuple[int, str]:
    """(exit code, stderr) of the CLI whose stdout and stdin are a pseudo-terminal."""
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "exirc", *args], stdin=terminal,
                              stdout=terminal, stderr=subprocess.PIPE, timeout=120,
                              env={**os.environ, "NO_COLOR": "1"})
    finally:
        os.close(terminal)
        os.close(controller)
    return done.returncode, done.stderr.decode()


@pytest.fixture()
def program_file(tmp_path: Path) -> Path:
    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


def test_compile_dash_o_dash_writes_the_program_to_stdout_and_inspect_reads_it(
        tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(textwrap.dedent(TINY_MODEL))
    compiled = exirc("compile", "tiny.py", "-o", "-", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr.decode()
    assert compiled.stdout[4:8] == b"ET12"
    assert deserialize(compiled.stdout).execution_plan[0].name == "forward"
    assert b"compiled tiny.py -> stdout" in compiled.stderr
    assert not (tmp_path / "tiny.pte").exists() and not (tmp_path / "-").exists()

    inspected = exirc("inspect", "-", stdin=compiled.stdout)
    assert inspected.returncode == 0, inspected.stderr.decode()
    text = inspected.stdout.decode()
    assert text.startswith("<stdin>: program file (ET12")
    assert "aten::mul.out" in text


def test_inspect_dash_json_reads_stdin(program_file: Path) -> None:
    import json

    inspected = exirc("inspect", "-", "--json", stdin=program_file.read_bytes())
    assert inspected.returncode == 0, inspected.stderr.decode()
    info = json.loads(inspected.stdout)
    assert info["file"]["path"] == "<stdin>"
    assert info["file"]["size"] == program_file.stat().st_size


def test_inspect_of_empty_stdin_is_a_usage_error() -> None:
    inspected = exirc("inspect", "-", stdin=b"")
    assert inspected.returncode == 2
    err = inspected.stderr.decode()
    assert err.startswith("error[E0200]: stdin is empty: no program to read")
    assert "hint: pipe a program into it" in err


def test_inspect_of_garbage_on_stdin_is_a_format_error() -> None:
    inspected = exirc("inspect", "-", stdin=b"\x00" * 64)
    assert inspected.returncode == 3
    assert inspected.stderr.decode().startswith("error[E0300]: header: file identifier")


def test_run_dash_o_dash_writes_the_npz_to_stdout_and_the_summary_to_stderr(
        program_file: Path) -> None:
    ran = exirc("run", str(program_file), "--random", "--repeat", "2", "-o", "-")
    assert ran.returncode == 0, ran.stderr.decode()
    outputs = numpy.load(io.BytesIO(ran.stdout))
    assert list(outputs.keys()) == ["output_0"]
    assert outputs["output_0"].shape == (2, 3)
    err = ran.stderr.decode()
    assert "method forward: 1 input, 1 output" in err
    assert "latency over 2 runs" in err
    assert "wrote 1 output to stdout" in err


def test_binary_output_to_a_terminal_is_refused_before_any_work(tmp_path: Path,
                                                                program_file: Path) -> None:
    (tmp_path / "tiny.py").write_text(textwrap.dedent(TINY_MODEL))
    code, err = exirc_on_terminal("compile", str(tmp_path / "tiny.py"), "-o", "-")
    assert code == 2
    assert "error[E0200]: -o - writes the program (binary data) to stdout, which is a " \
           "terminal" in err
    assert "hint: redirect stdout to a file or a pipe" in err
    assert "compiled" not in err  # refused before compiling

    code, err = exirc_on_terminal("run", str(program_file), "--random", "-o", "-")
    assert code == 2
    assert "-o - writes the outputs' .npz (binary data) to stdout, which is a terminal" in err


def test_inspect_dash_refuses_a_terminal_on_stdin() -> None:
    code, err = exirc_on_terminal("inspect", "-")
    assert code == 2
    assert "error[E0200]: `-` reads the program from stdin, which is a terminal" in err
    assert "exirc inspect - < model.pte" in err


def test_compile_dash_o_dash_refuses_explain_delegation_which_also_writes_stdout(
        tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(textwrap.dedent(TINY_MODEL))
    compiled = exirc("compile", str(tmp_path / "tiny.py"), "-o", "-", "--explain-delegation")
    assert compiled.returncode == 2
    assert b"-o - and --explain-delegation both write to stdout" in compiled.stderr
    assert compiled.stdout == b""


def test_a_file_named_dash_is_still_reachable_as_dot_slash_dash(tmp_path: Path,
                                                                program_file: Path) -> None:
    (tmp_path / "-").write_bytes(program_file.read_bytes())
    inspected = exirc("inspect", "./-", cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr.decode()
    assert inspected.stdout.decode().startswith("./-: program file")
