"""End to end: `exirc run --profile` and `--trace` compute what a plain run computes.

Timing a program must not change its answer: on the same `--random --seed` inputs, the
outputs `-o` writes with `--profile` and with `--trace FILE` equal a plain run's bit for
bit. Checked on the real CLI in subprocesses, on files the real CLI compiled: a float
XNNPACK program on `--engine auto` (where an installed engine runs the whole method,
profiled too), and a static int8 portable program (quantized kernels, thirteen
instructions) on `--engine reference`, where profiling times each instruction. Nothing
here decides by how long anything took.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest

from tests.cli.end_to_end import Workshop, exirc, read_npz

CASES = [
    pytest.param("cnn", ("--target", "xnnpack"), "auto", id="xnnpack-auto"),
    pytest.param("mlp", ("--quantize", "int8"), "reference", id="int8-portable-reference"),
]


def _run(pte: Path, engine: str, out: Path, *flags: str) -> str:
    """`exirc run PTE --random --seed 7 --engine ENGINE -o OUT FLAGS`: its stdout."""
    done = exirc("run", str(pte), "--random", "--seed", "7", "--engine", engine,
                 "-o", str(out), *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _assert_bit_for_bit(got: list[numpy.ndarray], expected: list[numpy.ndarray],
                        what: str) -> None:
    assert len(got) == len(expected), what
    for i, (a, b) in enumerate(zip(got, expected)):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{what}: output {i}"
        assert a.tobytes() == b.tobytes(), (
            f"{what}: output {i} differs from the plain run's, by up to "
            f"{float(numpy.abs(a.astype(numpy.float64) - b).max()):.3g}")


@pytest.mark.parametrize(("name", "flags", "engine"), CASES)
def test_profile_and_trace_write_a_plain_runs_outputs(workshop: Workshop, tmp_path: Path,
                                                      name: str, flags: tuple[str, ...],
                                                      engine: str) -> None:
    pte, _ = workshop.compiled(name, *flags)
    _run(pte, engine, tmp_path / "plain.npz")
    plain = read_npz(tmp_path / "plain.npz")
    assert plain and all(numpy.isfinite(a).all() for a in plain)

    profile = _run(pte, engine, tmp_path / "profiled.npz", "--profile")
    trace_file = tmp_path / "trace.json"
    _run(pte, engine, tmp_path / "traced.npz", "--trace", str(trace_file))

    assert "time per operator over 1 run" in profile, profile
    if engine == "reference":
        assert "slowest instructions" in profile, profile
    assert "\nplain runs: " in profile, profile  # and what runs them: an engine or not
    trace = json.loads(trace_file.read_text())
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "instruction"]
    assert slices, trace
    _assert_bit_for_bit(read_npz(tmp_path / "profiled.npz"), plain, f"{engine}, --profile")
    _assert_bit_for_bit(read_npz(tmp_path / "traced.npz"), plain, f"{engine}, --trace")
