"""The mutation suite's own machinery, so that its zeros mean something: the
runner tells a crash, a hang, a raw exception and a memory blow-up apart from
a clean run, and calls a process hung by the CPU time it spends (or, making
no progress at all, by a wall-clock cap), never because the machine is busy;
a mutant's label always makes the same bytes; and every mutation kind bends
a real program (none silently does nothing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exirc.serialize import deserialize, serialize
from exirc.serialize import program as P
from tests.busy_machine import busy_neighbours
from tools.mutants import report, server
from tools.mutants.bases import cached_bases
from tools.mutants.catalog import Catalog, build_catalog
from tools.mutants.child import Limits, pretend
from tools.mutants.context import BYTE_KINDS, MODEL_KINDS
from tools.mutants.crash_site import crash_site
from tools.mutants.generate import Mutant, Spec, make_mutant
from tools.mutants.runner import Result, run_mutants

# Some of the suite's own bases (TEST_BASES), so both share the built files.
BASES = ["conv.xnnpack", "dynamic_batch.portable", "gather_topk_pad.portable"]
SEEDS = 12


@pytest.fixture(scope="module")
def bases(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, bytes]:
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("mutants-bases") if cache is not None \
        else tmp_path_factory.mktemp("mutants-bases")
    return cached_bases(BASES, Path(folder))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return build_catalog()


def _pretending(routes: list[str], **budgets: float) -> list[Result]:
    mutants = [(i, Mutant(Spec("pretend", ("none",), 0, route), route, b""))
               for i, route in enumerate(routes)]
    try:
        return run_mutants(mutants, jobs=2, limits=Limits(), target=pretend, **budgets)
    finally:
        server.stop()


def test_the_runner_tells_each_failure_apart() -> None:
    # A wall-clock cap no honest process here comes near (they take
    # milliseconds): only the CPU budget can call the spinning one hung.
    results = _pretending(["ok", "crash", "spin", "raise", "memory"], cpu_budget=1.0,
                          wall_cap=600.0)
    assert [r.outcome for r in results] == ["ok", "crash", "hang", "traceback", "memory"]
    ok, crash, spin, raised, memory = results
    assert crash.exit_code == -11 and crash.last_stage == "load"
    assert "Segmentation fault" in crash.log  # faulthandler's dump, for the report
    assert spin.exit_code == -9 and spin.killed_for == "CPU budget"
    assert spin.cpu_seconds is not None and spin.cpu_seconds > 1.0
    assert raised.stages[0].detail == "ValueError: not a typed error"
    assert memory.stages[0].outcome == "E0340" and ok.peak_rss_kib
    assert not ok.killed_for and ok.cpu_seconds is not None and ok.cpu_seconds < 1.0


def test_a_process_that_makes_no_progress_is_a_hang_at_the_wall_clock_cap() -> None:
    # Asleep, it spends no CPU time: only the cap ends it.
    (stalled,) = _pretending(["stall"], cpu_budget=1.0, wall_cap=2.0)
    assert stalled.outcome == "hang" and stalled.killed_for == "no progress"
    assert stalled.exit_code == -9 and stalled.last_stage == "load"
    assert stalled.cpu_seconds is not None and stalled.cpu_seconds < 1.0


def test_a_mutant_of_200000_arenas_is_no_hang_on_a_busy_machine(
        bases: dict[str, bytes]) -> None:
    # The mutants `make test` once reported as hangs (issue 35): inspecting
    # them took 4.5 s of a quiet core, more than 10 s of wall-clock time
    # beside other work. Now a stage is judged by the CPU time it spends.
    program = deserialize(bases["dynamic_batch.portable"])
    program.execution_plan[0].non_const_buffer_sizes.extend([64] * 200_000)
    mutant = Mutant(Spec("dynamic_batch.portable", ("buffers_explode",), 0, "api"),
                    "forward non_const_buffer_sizes: 200000 more of 64 bytes",
                    serialize(program))
    with busy_neighbours() as neighbours:
        try:
            (result,) = run_mutants([(0, mutant)], jobs=1)
        finally:
            server.stop()
        assert all(neighbour.poll() is None for neighbour in neighbours)  # busy throughout
    assert result.outcome in ("ok", "typed"), report.explain(result)
    inspected = {stage.name: stage.outcome for stage in result.stages}
    assert inspected["inspect --json"] == "ok", result.stages


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS) + sorted(BYTE_KINDS))
def test_a_label_always_makes_the_same_mutant(kind: str, bases: dict[str, bytes],
                                              catalog: Catalog) -> None:
    for base in BASES:
        spec = Spec(base, (kind,), 7, "api")
        first, again = (make_mutant(spec, bases[base], catalog) for _ in range(2))
        assert first.data == again.data and first.description == again.description
        assert Spec.parse(spec.label) == spec


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS) + sorted(BYTE_KINDS))
def test_every_kind_bends_a_real_program(kind: str, bases: dict[str, bytes],
                                         catalog: Catalog) -> None:
    bent = [m for base in BASES for seed in range(SEEDS)
            if (m := make_mutant(Spec(base, (kind,), seed), bases[base], catalog)).data
            != bases[base] and not m.description.startswith("(no ")]
    assert bent, f"{kind} changed none of {BASES} in {SEEDS} seeds each"
    assert all(m.description.startswith(kind) for m in bent)


def test_a_crash_is_placed_at_the_instruction_after_the_last_completed(
        bases: dict[str, bytes]) -> None:
    data = bases["dynamic_batch.portable"]
    plan = deserialize(data).method("forward")

    def named(index: int) -> str:
        instruction = plan.chains[0].instructions[index]
        if isinstance(instruction, P.KernelCall):
            return plan.operators[instruction.op_index].qualified_name
        return type(instruction).__name__

    assert crash_site(data, "forward start") == \
        f"in instruction 0 of chain 0 of forward ({named(0)})"
    assert crash_site(data, "forward 0 0") == \
        f"in instruction 1 of chain 0 of forward ({named(1)})"
    assert crash_site(data, "forward 0 100000") == "after instruction 100000 of chain 0 of forward"
