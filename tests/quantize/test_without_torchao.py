"""torchao is the optional `quantize` extra: without it, `--quantize int8` (its pt2e
flow) is a usage error naming the extra, and leaves no file; the weight-only modes,
which need no torchao, still compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compile.test_cli_compile import MLP, write

WITHOUT = Path(__file__).resolve().parents[1] / "without_extras"


def _compile(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(WITHOUT),
                   "EXIRC_WITHOUT_EXTRAS": "torchao"}
    return subprocess.run([sys.executable, "-m", "exirc", "compile", "model.py",
                           "--quantize", mode, "-o", f"{mode}.pte"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=environment)


def test_int8_without_torchao_names_the_extra(tmp_path: Path) -> None:
    write(tmp_path, "model.py", MLP)
    done = _compile(tmp_path, "int8")
    assert done.returncode == 2, done.stderr
    assert "error[E0200]: --quantize int8 needs torchao's pt2e quantization, which is not " \
           "installed" in done.stderr
    assert "pip install 'exirc[quantize]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "int8.pte").exists()


@pytest.mark.parametrize("mode", ["int8-weight-only", "int4-weight-only"])
def test_weight_only_needs_no_torchao(tmp_path: Path, mode: str) -> None:
    write(tmp_path, "model.py", MLP)
    done = _compile(tmp_path, mode)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / f"{mode}.pte").stat().st_size > 0
