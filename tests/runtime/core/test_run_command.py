"""`exirc run`: inputs from files or random, outputs, latency, profile, errors."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import numpy
import pytest

from exirc.cli.app import main
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.oracle import executorch_pte, requires_executorch, run_with_executorch
from tests.programs import control_flow_program, index_out_of_range_program
from tests.runtime.core.test_interpreter import build, loop_program, planned

W = numpy.array([[0.5, -1.0, 2.0], [3.5, 0.0, -0.25]], dtype=numpy.float32)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture()
def x_npy(tmp_path: Path) -> Path:
    path = tmp_path / "x.npy"
    numpy.save(path, numpy.arange(6, dtype=numpy.float32).reshape(2, 3))
    return path


@pytest.mark.smoke
def test_summary_of_outputs(capsys: pytest.CaptureFixture[str], add_pte: Path,
                            x_npy: Path) -> None:
    code, out, err = run(capsys, str(add_pte), "--inputs", str(x_npy))
    assert code == 0, err
    assert out.splitlines() == [
        "method forward: 1 input, 1 output",
        "  output_0: f32[2, 3]  min 0  max 6.5  mean 3.292",
        "    [0.5, 0, 4, 6.5, 4, 4.75]",
    ]
    assert err == ""


def test_outputs_to_npz(capsys: pytest.CaptureFixture[str], add_pte: Path, x_npy: Path,
                        tmp_path: Path) -> None:
    target = tmp_path / "out.npz"
    code, _, err = run(capsys, str(add_pte), "-i", str(x_npy), "-o", str(target))
    assert code == 0, err
    assert err.strip() == f"wrote 1 output to {target}"
    with numpy.load(target) as saved:
        assert list(saved) == ["output_0"]
        expected = numpy.arange(6, dtype=numpy.float32).reshape(2, 3) + W
        numpy.testing.assert_array_equal(saved["output_0"], expected)


def test_inputs_from_npz(capsys: pytest.CaptureFixture[str], add_pte: Path,
                         tmp_path: Path) -> None:
    good = tmp_path / "good.npz"
    numpy.savez(good, input_0=numpy.zeros((2, 3), dtype=numpy.float32))
    code, out, _ = run(capsys, str(add_pte), "--inputs", str(good))
    assert code == 0 and "min -1  max 3.5" in out

    wrong = tmp_path / "wrong.npz"
    numpy.savez(wrong, x=numpy.zeros((2, 3), dtype=numpy.float32))
    code, out, err = run(capsys, str(add_pte), "--inputs", str(wrong))
    assert code == 2 and out == ""
    assert err.splitlines()[0] == (f"error[E0201]: {wrong} has the keys x, but method 'forward' "
                                   "takes input_0")
    assert "numpy.savez(path, input_0=...)" in err


def test_inputs_that_do_not_fit(capsys: pytest.CaptureFixture[str], add_pte: Path,
                                tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.npy"
    numpy.save(wrong, numpy.zeros((3, 2), dtype=numpy.float32))
    code, out, err = run(capsys, str(add_pte), "--inputs", str(wrong))
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == (
        "error[E0201]: input_0 has shape [3, 2], expected [2, 3] (f32[2, 3])")
    code, _, err = run(capsys, str(add_pte), "-i", str(wrong), "-i", str(wrong))
    assert code == 2 and "error[E0201]: method 'forward' takes 1 input, got 2" in err


def test_fortran_ordered_input_file(capsys: pytest.CaptureFixture[str], add_pte: Path,
                                    tmp_path: Path) -> None:
    path = tmp_path / "f.npy"
    numpy.save(path, numpy.asfortranarray(numpy.arange(6, dtype=numpy.float32).reshape(2, 3)))
    code, out, _ = run(capsys, str(add_pte), "--inputs", str(path))
    assert code == 0 and "[0.5, 0, 4, 6.5, 4, 4.75]" in out


def test_missing_files(capsys: pytest.CaptureFixture[str], add_pte: Path,
                       tmp_path: Path) -> None:
    code, _, err = run(capsys, str(tmp_path / "nope.pte"), "--random")
    assert code == 2 and err.startswith("error[E0200]: no such file:")
    code, _, err = run(capsys, str(add_pte), "--inputs", str(tmp_path / "nope.npy"))
    assert code == 2 and "nope.npy" in err.splitlines()[0]


def test_usage_errors(capsys: pytest.CaptureFixture[str], add_pte: Path, x_npy: Path) -> None:
    code, _, err = run(capsys, str(add_pte))
    assert code == 2
    assert err.splitlines() == ["error[E0200]: method 'forward' takes 1 input (input_0: f32[2, 3])",
                                "  hint: give them with --inputs FILE, or use --random",
                                "  see: exirc explain E0200"]
    code, _, err = run(capsys, str(add_pte), "--random", "--inputs", str(x_npy))
    assert code == 2 and "give --inputs or --random, not both" in err
    code, _, err = run(capsys, str(add_pte), "--seed", "3", "-i", str(x_npy))
    assert code == 2 and "--seed only applies to --random" in err
    code, _, err = run(capsys, str(add_pte), "--random", "--method", "backward")
    assert code == 2 and "no method named 'backward' in the program (methods: forward)" in err


def test_random_inputs_are_deterministic(capsys: pytest.CaptureFixture[str],
                                         add_pte: Path) -> None:
    first = run(capsys, str(add_pte), "--random", "--seed", "7")
    again = run(capsys, str(add_pte), "--random", "--seed", "7")
    other = run(capsys, str(add_pte), "--random", "--seed", "8")
    default = run(capsys, str(add_pte), "--random")
    assert first[0] == 0 and first == again
    assert other[1] != first[1] and default[1] != first[1]


def test_repeat_prints_latency_statistics(capsys: pytest.CaptureFixture[str],
                                          add_pte: Path) -> None:
    code, out, _ = run(capsys, str(add_pte), "--random", "--repeat", "5")
    assert code == 0
    assert re.search(r"^latency over 5 runs, after 1 warm-up run, on 1 thread:\n"
                     r"  mean \d+\.\d{3} ms  std \d+\.\d{3} ms  min \d+\.\d{3} ms  "
                     r"median \d+\.\d{3} ms  p90 \d+\.\d{3} ms  max \d+\.\d{3} ms$",
                     out, re.MULTILINE), out


def test_profile_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "loop.pte"
    path.write_bytes(serialize(loop_program()))
    x = tmp_path / "x.npy"
    n = tmp_path / "n.npy"
    numpy.save(x, numpy.ones(2, dtype=numpy.float32))
    numpy.save(n, numpy.array(3))
    code, out, err = run(capsys, str(path), "-i", str(x), "-i", str(n), "--profile",
                         "--repeat", "2")
    assert code == 0, err
    table = out[out.index("time per operator over 2 runs on 1 thread:"):].splitlines()
    assert table[1].split() == ["op", "calls", "total", "ms", "share"]
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert rows["aten::add.out"][1] == "6"  # 3 iterations, 2 runs
    assert rows["jump_false"][1] == "6" and rows["move"][1] == "6"
    assert rows["total"][1] == "34" and rows["total"][3] == "100.0%"
    assert "output_0: f32[2]" in out and "[3, 3]" in out


def test_unknown_backend_exit_code_4(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "cf.pte"
    path.write_bytes(serialize(control_flow_program()))
    code, out, err = run(capsys, str(path), "--random", "--method", "choose")
    assert (code, out) == (4, "")
    assert err.startswith("error[E0400]: no backend registered for 1 delegate: "
                          "backend 'ExampleBackend' (delegate 0 of method 'choose')")


def test_kernel_failure_exit_code_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.pte"
    path.write_bytes(serialize(index_out_of_range_program()))
    code, _, err = run(capsys, str(path), "--random")
    assert code == 3
    assert err.startswith("error[E0340]: while executing instruction 0 (aten::index_select.out) "
                          "of method 'forward': IndexError: index out of range in self")
    assert "Traceback" not in err


def test_plugin_registers_a_kernel(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    namespace = f"plugintest_{uuid.uuid4().hex}"  # the default registry is process-wide
    plugin = tmp_path / f"{namespace}.py"
    plugin.write_text(
        "import torch\n"
        "from exirc.runtime import register_kernel\n\n"
        f"@register_kernel('{namespace}::twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)')\n"
        "def twice(x, *, out):\n"
        "    return torch.mul(x, 2, out=out)\n")
    values: list[P.EValue] = [planned(0, [3]), planned(16, [3])]
    program = build(values, [P.KernelCall(0, [0, 1, 1])], [f"{namespace}::twice.out"],
                    inputs=[0], outputs=[1])
    path = tmp_path / "twice.pte"
    path.write_bytes(serialize(program))
    code, _, err = run(capsys, str(path), "--random")
    assert code == 4 and f"{namespace}::twice.out" in err
    x = tmp_path / "x.npy"
    numpy.save(x, numpy.array([1.0, -2.0, 0.5], dtype=numpy.float32))
    code, out, err = run(capsys, str(path), "-i", str(x), "--plugin", str(plugin))
    assert code == 0, err
    assert "[2, -4, 1]" in out
    code, _, err = run(capsys, str(path), "--random", "--plugin", "no_such_plugin_module")
    assert code == 2 and "cannot import the plugin 'no_such_plugin_module'" in err


def test_max_memory_and_max_steps(capsys: pytest.CaptureFixture[str], add_pte: Path,
                                  tmp_path: Path) -> None:
    code, _, err = run(capsys, str(add_pte), "--random", "--max-memory", "32")
    assert code == 3 and "more than the 32 bytes allowed (the max_memory limit)" in err
    code, _, err = run(capsys, str(add_pte), "--random", "--max-memory", "lots")
    assert code == 2 and "--max-memory: 'lots' is not a size" in err
    path = tmp_path / "loop.pte"
    path.write_bytes(serialize(loop_program()))
    code, _, err = run(capsys, str(path), "--random", "--max-steps", "50")
    # --random feeds n = 1: the loop runs once, in 7 instructions.
    assert code == 0, err
    code, _, err = run(capsys, str(path), "--random", "--max-steps", "5")
    assert code == 3 and err.startswith("error[E0341]: method 'forward' did not finish within 5")


def test_max_seconds_stops_a_loop_that_never_ends(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    # Only the wall-clock limit can end this run (its step budget is out of
    # reach): it does, on any machine.
    path = tmp_path / "forever.pte"
    path.write_bytes(serialize(build([P.Bool(False)], [P.JumpFalseCall(0, 0)], [], inputs=[],
                                     outputs=[])))
    code, _, err = run(capsys, str(path), "--max-steps", str(10**15), "--max-seconds", "0.1")
    assert code == 3 and err.startswith(
        "error[E0341]: method 'forward' did not finish within 0.1 s (its wall-clock limit)"), err
    assert "--max-seconds" in err  # the hint
    code, _, err = run(capsys, str(path), "--max-seconds", "0")
    assert code == 2 and "--max-seconds" in err


@requires_executorch
@pytest.mark.oracle
def test_executorch_file_through_the_cli(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    import torch

    pte, _ = executorch_pte("mlp")
    path = tmp_path / "mlp.pte"
    path.write_bytes(pte)
    x = numpy.random.default_rng(0).standard_normal((2, 8), dtype=numpy.float32)
    numpy.save(tmp_path / "x.npy", x)
    code, out, err = run(capsys, str(path), "-i", str(tmp_path / "x.npy"), "-o",
                         str(tmp_path / "out.npz"))
    assert code == 0, err
    assert "output_0: f32[2, 4]" in out
    (expected,) = run_with_executorch(pte, [torch.from_numpy(x)])
    with numpy.load(tmp_path / "out.npz") as saved:
        numpy.testing.assert_allclose(saved["output_0"], expected.numpy(), rtol=1e-4, atol=1e-5)
