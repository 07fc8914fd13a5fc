"""`exirc run` and `exirc inspect` on files that block, lie or hold odd values:
one typed error line and an exit code, never a hang, a traceback or noise.

Each case runs the real `exirc` in a subprocess with a timeout, so a
regression that blocks fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from exirc.cli.app import main
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program

EXIRC = str(Path(sys.executable).with_name("exirc"))


def exirc(*args: str, cwd: Path) -> tuple[int, str, list[str]]:
    """(exit code, stdout, stderr lines) of a real `exirc ARGS`."""
    done = subprocess.run([EXIRC, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr.splitlines()


def _write(path: Path, program: P.Program) -> Path:
    path.write_bytes(serialize(program))
    return path


def _passthrough(scalar_type: P.ScalarType) -> P.Program:
    """forward(x) = x, for an input of `scalar_type`: no kernel touches it."""
    tensor = P.Tensor(scalar_type, [2, 3], [0, 1], allocation_info=P.AllocationDetails.at(1, 0))
    plan = P.ExecutionPlan(name="forward", values=[tensor], inputs=[0], outputs=[0],
                           chains=[P.Chain(inputs=[0], outputs=[0], instructions=[])],
                           operators=[], non_const_buffer_sizes=[0, 64])
    return P.Program(execution_plan=[plan], segments=[])


def _with_none_output() -> P.Program:
    """add_constant_program with a second output that is None."""
    program = add_constant_program()
    plan = program.execution_plan[0]
    plan.values.append(P.Null())
    plan.outputs = [3, len(plan.values) - 1]
    plan.chains[0].outputs = plan.outputs
    return program


# --------------------------------------------------------------------------- what is not a file


@pytest.mark.parametrize("command", ["run", "inspect"])
def test_a_fifo_program_is_refused_at_once(tmp_path: Path, command: str) -> None:
    os.mkfifo(tmp_path / "model.pte")
    code, out, err = exirc(command, "model.pte", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == ["error[E0200]: model.pte is a FIFO (named pipe), not a regular program file",
                   "  hint: give the path of a program file on disk (save piped data to a file "
                   "first)",
                   "  see: exirc explain E0200"]


def test_a_device_is_no_program(tmp_path: Path) -> None:
    code, _, err = exirc("inspect", "/dev/zero", cwd=tmp_path)
    assert code == 2
    assert err[0] == "error[E0200]: /dev/zero is a character device, not a regular program file"


@pytest.mark.parametrize("name", ["x.npy", "inputs.npz"])
def test_a_fifo_input_is_refused_at_once(tmp_path: Path, name: str) -> None:
    _write(tmp_path / "add.pte", add_constant_program())
    os.mkfifo(tmp_path / name)
    code, _, err = exirc("run", "add.pte", "-i", name, cwd=tmp_path)
    assert code == 2
    assert err[0] == f"error[E0201]: {name}: is not a regular file (a pipe or device cannot " \
                     "be checked)"


def test_a_fifo_plugin_is_refused_at_once(tmp_path: Path) -> None:
    _write(tmp_path / "add.pte", add_constant_program())
    os.mkfifo(tmp_path / "kernels.py")
    code, _, err = exirc("run", "add.pte", "--random", "--plugin", "kernels.py", cwd=tmp_path)
    assert code == 2
    assert err[0] == "error[E0200]: kernels.py is a FIFO (named pipe), not a regular plugin file"


def test_run_checks_its_output_before_running(tmp_path: Path) -> None:
    _write(tmp_path / "add.pte", add_constant_program())
    os.mkfifo(tmp_path / "out.npz")
    code, out, err = exirc("run", "add.pte", "--random", "-o", "out.npz", cwd=tmp_path)
    assert (code, out) == (2, "")  # nothing ran: no summary
    assert err[0] == ("error[E0200]: cannot write the outputs file out.npz: it is a FIFO "
                      "(named pipe)")
    code, _, err = exirc("run", "add.pte", "--random", "-o", "/proc/out.npz", cwd=tmp_path)
    assert code == 2 and "it is under /proc, a kernel file system" in err[0]


# --------------------------------------------------------------------------- odd values


def test_random_inputs_of_an_opaque_type_and_their_outputs(tmp_path: Path) -> None:
    _write(tmp_path / "bits.pte", _passthrough(P.ScalarType.BITS16))
    code, out, err = exirc("run", "bits.pte", "--random", "-o", "out.npz", cwd=tmp_path)
    assert code == 0, err
    assert out.splitlines() == ["method forward: 1 input, 1 output",
                                "  output_0: bits16[2, 3]  (raw bits: values not shown)"]
    assert err == ["wrote 1 output to out.npz"]
    saved = numpy.load(tmp_path / "out.npz")
    assert saved["output_0"].dtype == numpy.uint16  # the raw bits
    assert set(saved["output_0"].ravel().tolist()) <= {0, 1}  # --random's 0s and 1s


def test_outputs_that_are_none_are_not_written_and_said_so(tmp_path: Path) -> None:
    _write(tmp_path / "two.pte", _with_none_output())
    code, out, err = exirc("run", "two.pte", "--random", "-o", "out.npz", cwd=tmp_path)
    assert code == 0, err
    assert "  output_1: None" in out.splitlines()
    assert err == ["wrote 1 output to out.npz (not an array, so not written: output_1 (None))"]
    assert list(numpy.load(tmp_path / "out.npz")) == ["output_0"]


# --------------------------------------------------------------------------- one line, no noise


WARNS = """\
import warnings
warnings.warn("a library's deprecation warning", DeprecationWarning)
warnings.warn("a library's user warning", UserWarning)
"""


def test_third_party_warnings_do_not_surround_the_error(tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(WARNS)
    (tmp_path / "bad.pte").write_bytes(b"\0" * 64)
    code, _, err = exirc("run", "bad.pte", "--plugin", "noisy.py", cwd=tmp_path)
    assert code == 3
    assert len(err) == 3 and err[0].startswith("error[E0300]: "), err
    code, _, err = exirc("run", "bad.pte", "--plugin", "noisy.py", "--debug", cwd=tmp_path)
    assert code == 3
    assert any("a library's user warning" in line for line in err)  # --debug shows all


# --------------------------------------------------------------------------- out of memory


def _out_of_memory(*args: object, **kwargs: object) -> None:
    raise MemoryError


def test_running_out_of_memory_says_what_was_being_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    program = _write(tmp_path / "add.pte", add_constant_program())
    monkeypatch.setattr("exirc.runtime.load", _out_of_memory)
    assert main(["run", str(program), "--random"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error[E0350]: out of memory while loading the program {program}"
    assert err[1].startswith("  hint: free memory")


def test_out_of_memory_elsewhere_is_a_resource_error_not_a_bug(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "hungry.py").write_text("raise MemoryError\n")
    program = _write(tmp_path / "add.pte", add_constant_program())
    code = main(["run", str(program), "--random", "--plugin", str(tmp_path / "hungry.py")])
    err = capsys.readouterr().err.splitlines()
    assert code == 3
    assert err[0] == "error[E0350]: out of memory while running `exirc run`"
    assert "Traceback" not in "\n".join(err) and "E0100" not in err[0]
