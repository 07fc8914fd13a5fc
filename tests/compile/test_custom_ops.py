"""Operators outside the Edge op set, through the real command line.

An operator nothing can run (no kernel on the target, no decomposition into
core ATen) is unsupported: exit code 4, E0401, naming the op, its source
line and module, and what the model's author can do. Custom operators pass
through to the program and run with a kernel from `--plugin`, given to both
`exirc compile` and `exirc run`. Boolean-mask indexing (a data-dependent
output size) compiles and runs as on ExecuTorch.

Each command runs in a subprocess: custom operators register themselves
process-wide, and plugins must be what makes a kernel known.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import numpy
import torch

from exirc.serialize import deserialize
from tests import warm_exirc
from tests.oracle import requires_executorch, run_with_executorch

REPO = Path(__file__).resolve().parents[2]


def exirc(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    return warm_exirc.exirc(args, cwd=directory, env=env, text=True, timeout=300)


def write(directory: Path, name: str, source: str) -> None:
    (directory / name).write_text(textwrap.dedent(source))


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The error report: the `error[...]` line, its hint and the `see:` line."""
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning:")]
    assert "Traceback" not in result.stderr
    assert len(lines) == 3, result.stderr
    return lines


def load_output(path: Path) -> numpy.typing.NDArray[numpy.generic]:
    with numpy.load(path) as outputs:
        return outputs["output_0"]


# --------------------------------------------------------------------------
# Unsupported ATen operators.
# --------------------------------------------------------------------------

ERFINV = """\
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.special.erfinv(x) + 1

model = Model().eval()
example_inputs = (torch.tensor([-0.5, 0.0, 0.25, 0.75]),)
"""

CUMPROD = """\
import torch

class Running(torch.nn.Module):
    def forward(self, x):
        return torch.cumprod(x, dim=0)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.running = Running()

    def forward(self, x):
        return self.running(x) * 2

model = Model().eval()
example_inputs = (torch.rand(4),)
"""

ERFINV_KERNEL = """\
import torch
from exirc.runtime import register_kernel

@register_kernel("aten::erfinv.out")
def erfinv_out(x, *, out):
    return torch.special.erfinv(x, out=out)
"""


def test_an_op_with_no_kernel_and_no_decomposition_is_unsupported(tmp_path: Path) -> None:
    write(tmp_path, "model.py", ERFINV)
    result = exirc(tmp_path, "compile", "model.py", "-o", "model.pte")
    assert result.returncode == 4
    error, hint, see = error_lines(result)
    assert error == (
        "error[E0401]: operator aten::erfinv is not supported: target 'portable' has no kernel "
        "for it (aten::erfinv.out), and it has no decomposition into core ATen ops; used at "
        "model.py:5: return torch.special.erfinv(x) + 1 [%erfinv]")
    assert hint == (
        "  hint: register a kernel for aten::erfinv.out (exirc.runtime.register_kernel) in a "
        "module you pass with --plugin to both `exirc compile` and `exirc run`, or change the "
        "model to avoid it")
    assert see == "  see: exirc explain E0401"
    assert not (tmp_path / "model.pte").exists()


def test_the_unsupported_op_is_named_with_its_module_path(tmp_path: Path) -> None:
    write(tmp_path, "model.py", CUMPROD)
    result = exirc(tmp_path, "compile", "model.py", "--target", "exirc")
    assert result.returncode == 4
    error, _, _ = error_lines(result)
    assert error == (
        "error[E0401]: operator aten::cumprod is not supported: target 'exirc' has no kernel "
        "for it (aten::cumprod.out), and it has no decomposition into core ATen ops; used at "
        "model.py:5: return torch.cumprod(x, dim=0) [%cumprod, module 'running' (Running)]")


def test_a_plugin_kernel_makes_an_unsupported_aten_op_run(tmp_path: Path) -> None:
    write(tmp_path, "model.py", ERFINV)
    write(tmp_path, "erfinv_kernel.py", ERFINV_KERNEL)
    result = exirc(tmp_path, "compile", "model.py", "--plugin", "./erfinv_kernel.py",
                   "--verify", "-o", "model.pte")
    assert result.returncode == 0, result.stderr
    assert "verified: 1 output matches eager PyTorch" in result.stderr
    x = numpy.array([-0.9, -0.1, 0.3, 0.6], dtype=numpy.float32)
    numpy.save(tmp_path / "x.npy", x)
    result = exirc(tmp_path, "run", "model.pte", "-i", "x.npy", "--plugin",
                   "./erfinv_kernel.py", "-o", "out.npz")
    assert result.returncode == 0, result.stderr
    expected = torch.special.erfinv(torch.from_numpy(x)) + 1
    numpy.testing.assert_allclose(load_output(tmp_path / "out.npz"), expected.numpy())


# --------------------------------------------------------------------------
# Custom operators.
# --------------------------------------------------------------------------

CUSTOM = """\
import torch

@torch.library.custom_op("exirc_test_custom::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor

@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)

class Block(torch.nn.Module):
    def forward(self, x):
        return scale(x.relu(), 3.0)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x + 1) - 2

model = Model().eval()
example_inputs = (torch.randn(2, 3),)
"""

# The run process does not import the model: the kernel's schema says it all.
CUSTOM_KERNEL = """\
from exirc.runtime import register_kernel

@register_kernel("exirc_test_custom::scale(Tensor x, float factor) -> Tensor")
def scale(x, factor):
    return x * factor
"""


def test_a_custom_op_compiles_and_runs_with_its_plugin_kernel(tmp_path: Path) -> None:
    write(tmp_path, "model.py", CUSTOM)
    write(tmp_path, "custom_kernels.py", CUSTOM_KERNEL)

    result = exirc(tmp_path, "compile", "model.py", "-o", "model.pte")
    assert result.returncode == 4
    error, hint, _ = error_lines(result)
    assert error == (
        "error[E0401]: custom operator exirc_test_custom::scale is not supported: no kernel for "
        "exirc_test_custom::scale is registered (target 'portable' has none of its own); used "
        "at model.py:13: return scale(x.relu(), 3.0) [%scale, module 'block' (Block)]")
    assert "--plugin to both `exirc compile` and `exirc run`" in hint
    assert not (tmp_path / "model.pte").exists()

    result = exirc(tmp_path, "compile", "model.py", "--plugin", "./custom_kernels.py",
                   "--verify", "-o", "model.pte")
    assert result.returncode == 0, result.stderr
    assert "verified: 1 output matches eager PyTorch" in result.stderr
    program = deserialize(tmp_path / "model.pte")
    operators = {(op.name, op.overload) for op in program.execution_plan[0].operators}
    assert ("exirc_test_custom::scale", "") in operators  # called as it is

    x = numpy.random.default_rng(0).standard_normal((2, 3)).astype(numpy.float32)
    numpy.save(tmp_path / "x.npy", x)
    result = exirc(tmp_path, "run", "model.pte", "-i", "x.npy")
    assert result.returncode == 4
    error, hint, _ = error_lines(result)
    assert error == ("error[E0400]: no kernel for 1 operator: exirc_test_custom::scale.default "
                     "(in 'forward')")
    assert "`exirc run --plugin`" in hint

    result = exirc(tmp_path, "run", "model.pte", "-i", "x.npy", "--plugin",
                   "./custom_kernels.py", "-o", "out.npz")
    assert result.returncode == 0, result.stderr
    expected = (torch.from_numpy(x) + 1).relu() * 3.0 - 2
    numpy.testing.assert_allclose(load_output(tmp_path / "out.npz"), expected.numpy(),
                                  rtol=1e-6)


# ExecuTorch's convention: a custom op defines an out overload, which the
# program calls (and ExecuTorch's runtime could, given a kernel for it).
CUSTOM_WITH_OUT = """\
import torch

lib = torch.library.Library("exirc_test_outlib", "DEF")
lib.define("scale(Tensor x, float factor) -> Tensor")
lib.define("scale.out(Tensor x, float factor, *, Tensor(a!) out) -> Tensor(a!)")
lib.impl("scale", lambda x, factor: x * factor, "CompositeExplicitAutograd")
lib.impl("scale.out", lambda x, factor, *, out: torch.mul(x, factor, out=out),
         "CompositeExplicitAutograd")
torch.library.register_fake("exirc_test_outlib::scale")(lambda x, factor: torch.empty_like(x))

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.exirc_test_outlib.scale(x.relu(), 2.5) - 1

model = Model().eval()
example_inputs = (torch.randn(5),)
"""

OUT_KERNEL = """\
import torch
from exirc.runtime import register_kernel

@register_kernel(
    "exirc_test_outlib::scale.out(Tensor x, float factor, *, Tensor(a!) out) -> Tensor(a!)")
def scale_out(x, factor, *, out):
    return torch.mul(x, factor, out=out)
"""


def test_a_custom_op_with_an_out_overload_is_called_as_that(tmp_path: Path) -> None:
    write(tmp_path, "model.py", CUSTOM_WITH_OUT)
    write(tmp_path, "out_kernels.py", OUT_KERNEL)
    write(tmp_path, "functional_kernels.py", CUSTOM_KERNEL.replace(
        "exirc_test_custom", "exirc_test_outlib"))

    result = exirc(tmp_path, "compile", "model.py", "--plugin", "./functional_kernels.py")
    assert result.returncode == 4
    error, hint, _ = error_lines(result)
    assert error.startswith("error[E0401]: custom operator exirc_test_outlib::scale is not "
                            "supported: no kernel for exirc_test_outlib::scale.out is registered")
    assert "register a kernel for exirc_test_outlib::scale.out" in hint

    result = exirc(tmp_path, "compile", "model.py", "--plugin", "./out_kernels.py",
                   "--verify", "-o", "model.pte")
    assert result.returncode == 0, result.stderr
    program = deserialize(tmp_path / "model.pte")
    operators = {(op.name, op.overload) for op in program.execution_plan[0].operators}
    assert ("exirc_test_outlib::scale", "out") in operators

    x = numpy.linspace(-2, 2, 5, dtype=numpy.float32)
    numpy.save(tmp_path / "x.npy", x)
    result = exirc(tmp_path, "run", "model.pte", "-i", "x.npy", "--plugin", "./out_kernels.py",
                   "-o", "out.npz")
    assert result.returncode == 0, result.stderr
    numpy.testing.assert_allclose(load_output(tmp_path / "out.npz"),
                                  numpy.maximum(x, 0) * 2.5 - 1, rtol=1e-6)


# --------------------------------------------------------------------------
# Boolean-mask indexing: the output size depends on the data.
# --------------------------------------------------------------------------

MASKS = """\
import torch

class Positive(torch.nn.Module):
    def forward(self, x):
        return x[x > 0]

class Rows(torch.nn.Module):
    def forward(self, x):
        return x[x[:, 0] > 0] * 2

model = Positive().eval()
example_inputs = (torch.randn(8),)
methods = {"rows": (Rows().eval(), (torch.randn(4, 3),))}
"""


def test_boolean_mask_indexing_compiles_and_runs_as_eager(tmp_path: Path) -> None:
    write(tmp_path, "model.py", MASKS)
    result = exirc(tmp_path, "compile", "model.py", "--verify", "-o", "model.pte")
    assert result.returncode == 0, result.stderr
    rows = numpy.array([[1, 2, 3], [-1, 5, 6], [0, 8, 9], [4, 4, 4]], dtype=numpy.float32)
    x = numpy.array([1.0, -1.0, 2.0, -3.0, 4.0, 5.0, -6.0, 7.0], dtype=numpy.float32)
    numpy.save(tmp_path / "x.npy", x)  # some positive: through the real command
    numpy.save(tmp_path / "rows.npy", rows)
    result = exirc(tmp_path, "run", "model.pte", "-i", "x.npy", "-o", "out.npz")
    assert result.returncode == 0, result.stderr
    numpy.testing.assert_array_equal(load_output(tmp_path / "out.npz"), x[x > 0])
    result = exirc(tmp_path, "run", "model.pte", "--method", "rows", "-i", "rows.npy",
                   "-o", "rows.npz")
    assert result.returncode == 0, result.stderr
    numpy.testing.assert_array_equal(load_output(tmp_path / "rows.npz"),
                                     rows[rows[:, 0] > 0] * 2)
    # None (an empty result) and all (the planned upper bound): the same runtime,
    # in process, without a second import of torch per case.
    from exirc.runtime import load

    program = load((tmp_path / "model.pte").read_bytes())
    for values, sign in (([-1.0] * 8, -1), ([0.5] * 8, 1)):
        x = numpy.array(values, dtype=numpy.float32)
        given = rows * sign
        numpy.testing.assert_array_equal(program.method("forward").run([x])[0].numpy(),
                                         x[x > 0])
        numpy.testing.assert_array_equal(program.method("rows").run([given])[0].numpy(),
                                         given[given[:, 0] > 0] * 2)


@requires_executorch
def test_executorch_runs_our_boolean_mask_program(tmp_path: Path) -> None:
    """ExecuTorch compiles `x[x > 0]` to `index.Tensor_out` into a bounded dynamic
    tensor, and so does exirc: its runtime runs our file to the same results."""
    write(tmp_path, "model.py", MASKS)
    result = exirc(tmp_path, "compile", "model.py", "-o", "model.pte")
    assert result.returncode == 0, result.stderr
    data = (tmp_path / "model.pte").read_bytes()
    for x in (torch.tensor([1.0, -1.0, 2.0, -3.0, 4.0, 5.0, -6.0, 7.0]), -torch.ones(8),
              torch.ones(8)):
        (got,) = run_with_executorch(data, [x])
        torch.testing.assert_close(got, x[x > 0])
