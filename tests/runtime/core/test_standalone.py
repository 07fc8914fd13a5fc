"""The runtime loads and runs programs without the compiler, exirc's own ops included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from exirc.compiler import CompileOptions, compile_module
from tests.oracle import MLP

COMPILER = ("capture", "aten", "edge", "backend", "plan", "emit", "compiler", "passes",
            "diagnostics")


def test_a_fused_exirc_program_runs_without_importing_the_compiler(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(2, 8)
    result = compile_module(model, (x,), options=CompileOptions(target="exirc"))
    assert any(op.name == "exirc::addmm_relu" for op in result.program.method("forward").operators)
    path = tmp_path / "mlp.pte"
    result.save(path)
    torch.save(x, tmp_path / "x.pt")
    script = f"""
import sys, torch
from exirc.runtime import load
out = load({str(path)!r}).run("forward", [torch.load({str(tmp_path / 'x.pt')!r})])[0]
torch.save(out, {str(tmp_path / 'out.pt')!r})
loaded = sorted(m for m in sys.modules
                if m.split(".")[:2][-1] in {COMPILER!r} and m.startswith("exirc."))
print(loaded)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "out.pt"), model(x))
