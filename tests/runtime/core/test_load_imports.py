"""Loading a small program imports torch and exirc's runtime, not what torch could pull in.

torch's Python meta kernels import torch._dynamo and sympy on first use,
more than a second together: the load-time meta checks of a small float
program need neither, nor does the XNNPACK delegates' shape check
(`meta_rules`). The optional engines (onnx, onnxruntime, LiteRT) are for
delegates and fused chains that run on them: a portable program loads and
runs without them. Each check runs in a fresh interpreter and reads
`sys.modules`; none times anything (`make bench` does).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import exirc

REPO = Path(__file__).resolve().parents[3]
NEVER_FOR_A_SMALL_PROGRAM = ("torch._dynamo", "sympy", "onnx", "onnxruntime", "ai_edge_litert",
                             "torchao")

# Prints, after loading argv[1] and again after running it, which of the
# modules named in argv[2] had been imported.
PROBE = """
import sys
import torch
from exirc.runtime import load
watched = sys.argv[2].split(",")
program = load(sys.argv[1])
print(sorted(name for name in watched if name in sys.modules))
program.run("forward", [torch.randn(2, 16)])
print(sorted(name for name in watched if name in sys.modules))
"""


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mlp.py (addmm, relu, softmax), compiled for the portable target."""
    path = tmp_path_factory.mktemp("mlp") / "mlp.pte"
    exirc.compile(REPO / "examples" / "mlp.py", output=path, target="portable")
    return path


@pytest.fixture(scope="module")
def xnnpack_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mlp.py with its linear layers in an XNNPACK delegate."""
    path = tmp_path_factory.mktemp("mlp") / "mlp_xnnpack.pte"
    exirc.compile(REPO / "examples" / "mlp.py", output=path, target="xnnpack")
    return path


def imported_by_loading(program: Path, watched: tuple[str, ...]) -> list[str]:
    """The lines of PROBE: what loading `program` imported, then what running it did."""
    run = subprocess.run([sys.executable, "-c", PROBE, str(program), ",".join(watched)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_loading_and_running_a_small_program_imports_neither_dynamo_nor_sympy(mlp: Path) -> None:
    assert imported_by_loading(mlp, NEVER_FOR_A_SMALL_PROGRAM) == ["[]", "[]"]


def test_an_xnnpack_delegate_is_shape_checked_without_dynamo_or_sympy(xnnpack_mlp: Path) -> None:
    """Its engines (onnxruntime, LiteRT) may load, when installed: they run it."""
    assert imported_by_loading(xnnpack_mlp, ("torch._dynamo", "sympy")) == ["[]", "[]"]


def test_the_probe_sees_what_the_meta_kernels_import(mlp: Path) -> None:
    """The same probe sees torch._dynamo and sympy once a Python meta kernel has
    run: what the first test finds absent is absent because load avoided it."""
    watched = ("torch._dynamo", "sympy")
    probe_after_a_meta_call = PROBE.replace(
        "program = load(sys.argv[1])",
        "torch.ops.aten.relu.out(torch.empty(2, device='meta'), "
        "out=torch.empty(2, device='meta'))\nprogram = load(sys.argv[1])")
    run = subprocess.run([sys.executable, "-c", probe_after_a_meta_call, str(mlp),
                          ",".join(watched)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == str(sorted(watched))
