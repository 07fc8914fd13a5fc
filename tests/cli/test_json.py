"""`--json` on `compile` and `run`, and the JSON error object of a failing `--json`."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy
import pytest

from exirc.serialize.writer import serialize
from tests import warm_exirc
from tests.cli.tiny_model import TINY_MODEL
from tests.programs import add_constant_program


def exirc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return warm_exirc.exirc(args, text=True, timeout=120, cwd=cwd,
                            env={**os.environ, "NO_COLOR": "1"})


def parsed(done: subprocess.CompletedProcess[str], kind: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(done.stdout)
    assert info["format"] == f"exirc.{kind}" and info["format_version"] == 1
    return info


@pytest.fixture()
def add_pte(tmp_path: Path) -> Path:
    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


def test_compile_json_reports_the_file_plan_stages_and_verification(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(textwrap.dedent(TINY_MODEL))
    done = exirc("compile", "tiny.py", "--verify", "--json", "-o", "tiny.pte", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = parsed(done, "compile")
    program = tmp_path / "tiny.pte"
    assert info["output"] == "tiny.pte"
    assert info["file_size"] == program.stat().st_size
    assert info["segments"][0]["role"] == "constants"
    assert sum(s["size"] for s in info["segments"]) < info["file_size"]
    # At least x * 2 (a [2, 3] float tensor) lives in the arena.
    assert 24 <= info["arena_lower_bound_bytes"] <= info["arena_bytes"]
    (arena,) = info["arenas"]  # as `inspect --show memory` reports it
    assert arena["method"] == "forward" and arena["bytes"] == info["arena_bytes"]
    assert 24 <= arena["peak_live_bytes"] <= arena["bytes"]
    shown = exirc("inspect", "tiny.pte", "--show", "memory", "--json", cwd=tmp_path)
    assert f'"peak_bytes": {arena["peak_live_bytes"]}' in shown.stdout
    assert list(info["stage_seconds"])[:2] == ["capture", "aten"]
    assert "verify" in info["stage_seconds"]
    assert info["total_seconds"] >= max(info["stage_seconds"].values())
    assert info["methods"] == ["forward"]
    assert info["verification"]["ok"] is True
    assert info["verification"]["outputs_compared"] == 1
    assert "compiled" not in done.stderr  # the human summary gives way to the JSON


def test_compile_json_error_object_on_stdout_with_the_exit_code(tmp_path: Path) -> None:
    done = exirc("compile", str(tmp_path / "missing.py"), "--json", "-o",
                 str(tmp_path / "m.pte"))
    assert done.returncode == 2
    error = parsed(done, "error")["error"]
    assert error["code"] == "E0200" and error["exit_code"] == 2
    assert "missing.py" in error["message"]
    assert error["hint"]
    assert done.stderr.startswith("error[E0200]")  # stderr says it as always


def test_run_json_outputs_and_latency(add_pte: Path) -> None:
    done = exirc("run", str(add_pte), "--random", "--repeat", "3", "--json")
    assert done.returncode == 0, done.stderr
    info = parsed(done, "run")
    assert info["method"] == "forward" and info["inputs"] == 1 and info["runs"] == 3
    (out,) = info["outputs"]
    assert out["index"] == 0 and out["name"] == "output_0"
    assert out["dtype"] == "f32" and out["shape"] == [2, 3]
    assert out["min"] <= out["mean"] <= out["max"]
    latency = info["latency_ms"]
    assert latency["min_ms"] <= latency["median_ms"] <= latency["p90_ms"] <= latency["max_ms"]
    assert info["outputs_file"] is None
    # The suite runs programs on the reference interpreter (tests/conftest.py).
    assert info["execution"] == "instruction by instruction (EXIRC_ENGINE='reference')"
    assert (info["engine"], info["delegate_engines"]) == ("reference", [])


def test_run_json_statistics_are_the_outputs(add_pte: Path, tmp_path: Path) -> None:
    done = exirc("run", str(add_pte), "--random", "--json", "-o", str(tmp_path / "out.npz"))
    assert done.returncode == 0, done.stderr
    out = parsed(done, "run")["outputs"][0]
    saved = numpy.load(tmp_path / "out.npz")["output_0"]
    assert out["min"] == pytest.approx(float(saved.min()))
    assert out["max"] == pytest.approx(float(saved.max()))
    assert out["mean"] == pytest.approx(float(saved.mean()), abs=1e-6)
    assert "latency_ms" in parsed(done, "run") and parsed(done, "run")["latency_ms"] is None


@pytest.mark.parametrize(("args", "code", "exit_code"), [
    (["--random", "--max-memory", "32"], "E0350", 3),
    (["--random", "--shape", "input_0=3x3"], "E0201", 2),
    (["--random", "--no-such-flag"], "E0200", 2),
    (["--random", "-o", "-"], "E0200", 2),
])
def test_run_json_errors(add_pte: Path, args: list[str], code: str, exit_code: int) -> None:
    done = exirc("run", str(add_pte), "--json", *args)
    assert done.returncode == exit_code
    error = parsed(done, "error")["error"]
    assert error["code"] == code and error["exit_code"] == exit_code
    assert error["message"] and error["message"].split(":")[0] in done.stderr


def test_without_json_an_error_prints_nothing_on_stdout(add_pte: Path) -> None:
    done = exirc("run", str(add_pte), "--random", "--max-memory", "32")
    assert done.returncode == 3 and done.stdout == ""
