"""`exirc run`'s timing: --repeat statistics after --warmup, --threads, the
per-instruction --profile (text and --json) and the --trace timeline.

Each case runs the real CLI in a subprocess. The loop program runs 17
instructions per call with n = 3: instruction 0 once, 1 to 5 (add, move,
counter, compare, jump) three times each, and 6 once.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy
import pytest

from exirc.serialize.writer import serialize
from tests import warm_exirc
from tests.runtime.core.test_interpreter import loop_program

STATISTICS = ["mean_ms", "std_ms", "min_ms", "median_ms", "p90_ms", "max_ms"]
LOOP_CALLS = {"aten::mul.Scalar_out": 1, "aten::add.out": 3, "move": 3,
              "executorch_prim::add.Scalar": 3, "executorch_prim::eq.Scalar": 3,
              "jump_false": 3, "executorch_prim::sub.Scalar": 1}


def exirc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return warm_exirc.exirc(args, text=True, timeout=120, cwd=cwd,
                            env={**os.environ, "NO_COLOR": "1"})


@pytest.fixture()
def loop_args(tmp_path: Path) -> list[str]:
    """The loop program and its inputs (x = [1, 1], n = 3), as `run` arguments."""
    path = tmp_path / "loop.pte"
    path.write_bytes(serialize(loop_program()))
    numpy.save(tmp_path / "x.npy", numpy.ones(2, dtype=numpy.float32))
    numpy.save(tmp_path / "n.npy", numpy.array(3))
    return [str(path), "-i", str(tmp_path / "x.npy"), "-i", str(tmp_path / "n.npy")]


def run_json(*args: str) -> dict[str, Any]:
    done = exirc("run", *args, "--json")
    assert done.returncode == 0, done.stderr
    info: dict[str, Any] = json.loads(done.stdout)
    assert info["format"] == "exirc.run" and info["format_version"] == 1
    return info


# --------------------------------------------------------------------------- statistics


def test_json_statistics_in_order_with_default_warmup_and_one_thread(add_pte: Path) -> None:
    info = run_json(str(add_pte), "--random", "--repeat", "25")
    assert (info["runs"], info["warmup_runs"], info["threads"]) == (25, 2, 1)
    latency = info["latency_ms"]
    assert list(latency) == STATISTICS
    assert 0 < latency["min_ms"] <= latency["median_ms"] <= latency["p90_ms"] \
        <= latency["max_ms"]
    assert latency["min_ms"] <= latency["mean_ms"] <= latency["max_ms"]
    assert 0 <= latency["std_ms"] <= latency["max_ms"] - latency["min_ms"]


def test_warmup_and_threads_as_given(add_pte: Path) -> None:
    info = run_json(str(add_pte), "--random", "--repeat", "3", "--warmup", "0",
                    "--threads", "2")
    assert (info["runs"], info["warmup_runs"], info["threads"]) == (3, 0, 2)
    single = run_json(str(add_pte), "--random")
    assert (single["runs"], single["warmup_runs"], single["latency_ms"]) == (1, 0, None)


def test_text_statistics_say_runs_warmup_and_threads(add_pte: Path) -> None:
    done = exirc("run", str(add_pte), "--random", "--repeat", "4", "--warmup", "3",
                 "--threads", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("latency over 4 runs, after 3 warm-up runs, on 2 threads:")
    words = lines[at + 1].split()
    assert words[0::3] == [key.removesuffix("_ms") for key in STATISTICS]
    assert words[2::3] == ["ms"] * 6
    figures = dict(zip(words[0::3], map(float, words[1::3])))
    assert figures["min"] <= figures["median"] <= figures["p90"] <= figures["max"]


@pytest.mark.parametrize("count", ["0", "-1", "1025"])
def test_threads_out_of_range_is_a_usage_error(add_pte: Path, count: str) -> None:
    done = exirc("run", str(add_pte), "--random", f"--threads={count}")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"error[E0200]: --threads must be between 1 and 1024, "
                                  f"not {count}")
    assert "hint: 1 (the default) gives the steadiest latency" in done.stderr


def test_threads_not_a_number_and_negative_warmup_are_usage_errors(add_pte: Path) -> None:
    for option, problem in (("--threads=many", "'many' is not a valid integer"),
                            ("--warmup=-1", "-1 is not in the range x>=0")):
        done = exirc("run", str(add_pte), "--random", option)
        assert done.returncode == 2 and done.stdout == ""
        assert f"Invalid value for '{option.split('=')[0]}': {problem}" in done.stderr


def test_check_refuses_warmup_and_trace(add_pte: Path, tmp_path: Path) -> None:
    done = exirc("run", str(add_pte), "--check", "--warmup", "2", "--trace",
                 str(tmp_path / "t.json"))
    assert done.returncode == 2
    assert "--check runs the bundled inputs; it does not take --warmup, --trace" in done.stderr
    assert not (tmp_path / "t.json").exists()


# --------------------------------------------------------------------------- profile


def test_json_profile_per_operator_and_per_instruction(loop_args: list[str]) -> None:
    info = run_json(*loop_args, "--profile", "--repeat", "2")
    ops = {row["op"]: row for row in info["profile"]}
    assert {name: row["calls"] for name, row in ops.items()} == \
        {name: 2 * calls for name, calls in LOOP_CALLS.items()}
    assert all(set(row) == {"op", "calls", "total_ms", "share"} for row in ops.values())
    assert sum(row["share"] for row in ops.values()) == pytest.approx(1.0)
    instructions = info["instructions"]
    assert [(row["chain"], row["index"]) for row in instructions] == [(0, i) for i in range(7)]
    assert [row["calls"] for row in instructions] == [2, 6, 6, 6, 6, 6, 2]
    assert instructions[1]["op"] == "aten::add.out" and instructions[5]["op"] == "jump_false"
    assert all(row["module"] == "" and row["source"] == "" for row in instructions)
    total = sum(row["total_ms"] for row in instructions)
    assert total == pytest.approx(sum(row["total_ms"] for row in ops.values()))
    assert "instructions" not in run_json(*loop_args)  # only with --profile


def test_text_profile_names_the_slowest_instructions_source_line(add_pte: Path) -> None:
    done = exirc("run", str(add_pte), "--random", "--profile")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("slowest instructions (of 1 that ran):")
    assert lines[at + 1].split() == ["chain:instr", "op", "calls", "total", "ms", "share",
                                     "source"]
    row = lines[at + 2].split(maxsplit=6)
    assert row[:3] == ["0:0", "aten::add.out", "1"] and row[4] == "100.0%"
    assert row[5:] == ["model.py:12", "in forward: return x + self.w"]


def test_slowest_table_shows_modules_when_known() -> None:
    from exirc.cli.run_outputs import slowest_table

    rows = [{"chain": 0, "index": 4, "op": "aten::addmm.out", "calls": 2, "total_ms": 1.5,
             "share": 0.75, "source": "m.py:3 in forward: x = self.fc(x)", "module": "fc"},
            {"chain": 1, "index": 12, "op": "move", "calls": 2, "total_ms": 0.5,
             "share": 0.25, "source": "", "module": ""}]
    lines = slowest_table(rows, 9).splitlines()
    assert lines[0] == "slowest instructions (of 9 that ran):"
    assert lines[1].split()[-2:] == ["module", "source"]
    assert lines[2].split() == ["0:4", "aten::addmm.out", "2", "1.500", "75.0%", "fc", "m.py:3",
                                "in", "forward:", "x", "=", "self.fc(x)"]
    assert lines[3].split() == ["1:12", "move", "2", "0.500", "25.0%", "-", "(not", "recorded)"]


# --------------------------------------------------------------------------- trace


def test_trace_has_a_slice_per_instruction_run_inside_its_run(loop_args: list[str],
                                                              tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.json"
    done = exirc("run", *loop_args, "--repeat", "3", "--trace", str(trace_path))
    assert done.returncode == 0, done.stderr
    assert "wrote a trace of 3 runs, 51 instruction slices, to" in done.stderr
    assert "time per operator over 3 runs" in done.stdout  # --trace implies --profile
    trace = json.loads(trace_path.read_text())
    assert trace["otherData"]["runs_traced"] == 3 and trace["otherData"]["threads"] == 1
    events = trace["traceEvents"]
    assert all(event["ph"] in ("X", "M") for event in events)
    runs = [event for event in events if event.get("cat") == "run"]
    slices = [event for event in events if event.get("cat") == "instruction"]
    assert [run["name"] for run in runs] == ["run 1", "run 2", "run 3"]
    assert collections.Counter(event["name"] for event in slices) == \
        {name: 3 * calls for name, calls in LOOP_CALLS.items()}
    for number, run in enumerate(runs):
        inside = [event for event in slices
                  if run["ts"] <= event["ts"] and event["ts"] + event["dur"]
                  <= run["ts"] + run["dur"] + 0.002]  # microseconds, rounded to ns
        assert [event["args"]["index"] for event in inside] == \
            [0, *[1, 2, 3, 4, 5] * 3, 6], number
    assert set(slices[0]["args"]) == {"source", "module", "chain", "index"}
    assert (trace_path.stat().st_mode & 0o777) == 0o666 & ~_umask()


def test_trace_write_problems_are_usage_errors_before_running(add_pte: Path,
                                                              tmp_path: Path) -> None:
    missing = tmp_path / "no" / "trace.json"
    done = exirc("run", str(add_pte), "--random", "--trace", str(missing))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"error[E0200]: cannot write the trace file {missing}: "
                                  f"directory {missing.parent} does not exist")
    before = add_pte.read_bytes()
    done = exirc("run", str(add_pte), "--random", "--trace", str(add_pte))
    assert done.returncode == 2
    assert f"--trace {add_pte} would overwrite the program" in done.stderr
    assert add_pte.read_bytes() == before
    done = exirc("run", str(add_pte), "--random", "--trace", "-", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error[E0200]: --trace writes to a file, not to stdout (-)")
    assert not (tmp_path / "-").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(("limit", "kept"), [(40, 2), (51, 3), (10, 1)])
def test_the_timeline_keeps_whole_runs_within_its_limit(monkeypatch: pytest.MonkeyPatch,
                                                        limit: int, kept: int) -> None:
    import torch

    from exirc.cli import run_timing
    from exirc.runtime import Profile, load

    monkeypatch.setattr(run_timing, "TRACE_SLICE_LIMIT", limit)
    method = load(serialize(loop_program())).method("forward")
    profile = Profile(timeline=True)
    runs = run_timing.timed_runs(method, [torch.ones(2), 3], 5, 2, profile)
    assert len(runs.seconds) == 5 and len(runs.on_timeline) == kept
    assert profile.timeline is not None and len(profile.timeline) == 17 * kept
    assert sum(slot.calls for slot in profile.instructions) == 17 * 5  # warm-up forgotten
    assert torch.equal(runs.outputs[0], torch.full((2,), 3.0))
