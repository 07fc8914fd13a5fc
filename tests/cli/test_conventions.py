"""CLI conventions: help, version, exit codes, one-line errors, no torch import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exirc import __version__
from exirc.cli.app import SUBCOMMANDS, main
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def python_exirc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exirc", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


@pytest.mark.smoke
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert __version__ in out


@pytest.mark.parametrize("command", [[], *[[name] for name in SUBCOMMANDS]])
def test_every_command_has_help_with_examples(capsys: pytest.CaptureFixture[str],
                                              command: list[str]) -> None:
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0
    assert "Usage:" in out and "Examples:" in out


@pytest.mark.smoke
def test_python_m_exirc_and_no_torch_for_help_version_inspect(tmp_path: Path) -> None:
    pte = tmp_path / "add.pte"
    pte.write_bytes(serialize(add_constant_program()))
    probe = (
        "import sys\n"
        "from exirc.cli.app import main\n"
        "for args in (['--help'], ['--version'], ['inspect', sys.argv[1]],"
        " ['inspect', sys.argv[1], '--json'], ['inspect', '--help']):\n"
        "    assert main(args) == 0, args\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(pte)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    module_run = python_exirc("inspect", str(pte))
    assert module_run.returncode == 0
    assert "aten::add.out" in module_run.stdout


def test_missing_file_is_a_usage_error_with_hint(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    code, out, err = run(capsys, "inspect", str(tmp_path / "nope.pte"))
    assert code == 2
    assert out == ""
    assert err.startswith("error[E0200]: no such file:")
    assert "hint:" in err and "Traceback" not in err


def test_invalid_file_exit_code_3_one_line(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"\x00" * 64)
    code, out, err = run(capsys, "inspect", str(bad))
    assert code == 3
    assert out == ""
    first, *rest = err.strip().splitlines()
    assert first.startswith("error[E0300]: header: file identifier")
    assert len(rest) == 2 and rest[0].strip().startswith("hint:")
    assert rest[1] == "  see: exirc explain E0300"


def test_debug_shows_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"\x00" * 64)
    code, _, err = run(capsys, "--debug", "inspect", str(bad))
    assert code == 3
    assert "Traceback" in err and "FormatError" in err


def test_bad_option_is_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "inspect", "--no-such-flag", "x.pte")
    assert code == 2
    assert "no-such-flag" in err


def test_internal_errors_are_reported_not_raised(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    pte = tmp_path / "add.pte"
    pte.write_bytes(serialize(add_constant_program()))

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr("exirc.cli.inspect_command.describe", broken)
    code, _, err = run(capsys, "inspect", str(pte))
    assert code == 1
    assert err.startswith("error[E0100]: KeyError: 'boom'")
    assert "please report" in err and "Traceback" not in err


def test_no_color_when_not_a_terminal_or_no_color(tmp_path: Path) -> None:
    pte = tmp_path / "add.pte"
    pte.write_bytes(serialize(add_constant_program()))
    for env in ({}, {"NO_COLOR": "1"}):
        result = python_exirc("inspect", str(pte), env=env)
        assert "\x1b[" not in result.stdout
    failed = python_exirc("inspect", str(tmp_path / "missing.pte"), env={"NO_COLOR": "1"})
    assert "\x1b[" not in failed.stderr


def test_color_on_a_terminal_unless_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    from exirc.cli.style import styler

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert styler(Tty(), bold=True)("x") != "x"  # type: ignore[arg-type]
    monkeypatch.setenv("NO_COLOR", "1")
    assert styler(Tty(), bold=True)("x") == "x"  # type: ignore[arg-type]


@pytest.mark.parametrize("place", ["before", "after", "environment"])
def test_debug_before_or_after_the_subcommand_or_from_the_environment(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        place: str) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    args = {"before": ["--debug", "inspect", str(bad)], "after": ["inspect", str(bad), "--debug"],
            "environment": ["inspect", str(bad)]}[place]
    if place == "environment":
        monkeypatch.setenv("EXIRC_DEBUG", "1")
    code, _, err = run(capsys, *args)
    assert code == 3
    assert "Traceback" in err


def test_quiet_and_verbose_before_the_subcommand_reach_it() -> None:
    from exirc.cli.app import normalize_arguments

    assert normalize_arguments(["-q", "compile", "m.py"]) == (["compile", "-q", "m.py"], False)
    assert normalize_arguments(["-v", "--debug", "compile", "m.py", "--", "--debug"]) == \
        (["compile", "-v", "m.py", "--", "--debug"], True)
    assert normalize_arguments(["-q"]) == (["-q"], False)  # no subcommand: click says so
