"""`exirc run --allow-any-aten-op`: an ATen operator off the runtime's allowlist is
refused unless the user says they trust the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from exirc.serialize import program as P
from exirc.serialize import serialize
from tests.programs import add_constant_program

EXIRC = str(Path(sys.executable).with_name("exirc"))


def _run(path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXIRC, "run", str(path), "--random", *flags], capture_output=True,
                          text=True, timeout=120)


def test_off_list_aten_op_runs_only_when_the_file_is_trusted(tmp_path: Path) -> None:
    program = add_constant_program()  # x + W, as aten::add.out
    # Same arguments, but ExecuTorch's portable kernels do not implement it.
    program.execution_plan[0].operators = [P.Operator("aten::_add_relu", "out")]
    path = tmp_path / "add_relu.pte"
    path.write_bytes(serialize(program))

    refused = _run(path)
    assert refused.returncode == 4
    assert "error[E0400]: 1 ATen operator off the runtime allowlist: aten::_add_relu.out" \
        in refused.stderr
    assert "--allow-any-aten-op" in refused.stderr

    trusted = _run(path, "--allow-any-aten-op")
    assert trusted.returncode == 0, trusted.stderr
    assert "output_0: f32[2, 3]  min 0 " in trusted.stdout  # relu: nothing below zero
