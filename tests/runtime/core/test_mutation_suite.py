"""The runtime mutation suite (issue 16): the runtime survives any file.

Thousands of mutants of real programs (exirc's and ExecuTorch's: MLP, conv,
attention, LSTM, embedding, gather/topk/pad, cond, map, while_loop, dynamic
batch, program state, int8 on XNNPACK), each with operators swapped for
other real ones, lists, dims, dtypes, dim orders, sizes, offsets, overlaps,
argument kinds, jumps or bytes changed (`tools/mutants`). Each runs in its own
process with a budget of CPU time (a busy machine cannot make a hang) and a
memory limit: loaded and run through the API on the reference interpreter
(on random inputs, or edge values) and again on the optional engines, through
`exirc run` (with random inputs, or a bent .npz of inputs), then every
`exirc inspect` view. None may crash, hang, blow the memory limit or raise
anything but a typed exirc error, and no engine may answer where the reference
raised or answer otherwise than the reference (a wrong answer without an
error); and enough of
them must still load and run that the suite cannot pass by the runtime
refusing everything. Every base program, unmutated, must run cleanly, and
must survive edge-value inputs (indices out of range, NaN: typed errors are
fine) - the probes that reach kernels with no mutation to stop them first.

`make fuzz` runs the same campaign longer (`tools/mutation_campaign.py`);
it reproduces any mutant named here by its label.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tools.mutants import report, server
from tools.mutants.bases import TEST_BASES, available
from tools.mutants.cli_sample import run_sample
from tools.mutants.generate import (
    controls,
    hostile_probes,
    is_control,
    make_mutant,
    plan_mutants,
)
from tools.mutants.runner import Result, run_mutants
from tools.mutants.session import prepare

MUTANTS = 1200  # a sample on every `make test`; `make fuzz` runs 12,000
CLI_SAMPLE = 20  # of them, also through the real `exirc inspect` in a new process,
CLI_RUNS = 6  # and this many through the real `exirc run` (seconds each: it imports torch)
SEED = 16
JOBS = 2
# At least this share of mutants must run a method to its end at least once.
MIN_RAN = 0.15

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def campaign(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[list[Result], list[Result]]:
    """(forked results, real-command results), controls first."""
    names = available(TEST_BASES)
    # Built once per version of the compiler's sources (about 30 s), kept in
    # pytest's cache when there is one.
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("mutants-bases") if cache is not None \
        else tmp_path_factory.mktemp("mutants-bases")
    session = prepare(names, Path(folder))
    bases, catalog = session.bases, session.catalog
    specs = controls(names) + hostile_probes(names) + plan_mutants(names, MUTANTS, SEED)
    mutants = ((i, make_mutant(spec, bases[spec.base], catalog)) for i, spec in enumerate(specs))
    try:
        forked = run_mutants(mutants, jobs=JOBS, warm_modules=session.warm_modules)
    finally:
        server.stop()
    picked = random.Random(SEED).sample(range(len(controls(names)), len(specs)), CLI_SAMPLE)
    sampled = run_sample([(i, make_mutant(specs[i], bases[specs[i].base], catalog))
                          for i in picked], runs=CLI_RUNS, jobs=JOBS)
    return forked, sampled


def _explained(results: list[Result], tmp_path: Path) -> str:
    """Each failure on a line (base, mutation, outcome, first error), bytes saved."""
    saved = report.save_reproducers(results, tmp_path / "mutants")
    lines = report.failure_lines(results)
    more = len(report.failures(results)) - len(lines)
    return "\n".join(lines + ([f"... and {more} more"] if more > 0 else [])
                     + [f"mutants saved in {tmp_path / 'mutants'} ({len(saved)} files); "
                        "rerun one: python -m tools.mutation_campaign --replay LABEL"])


def test_every_base_program_runs_cleanly_unmutated(
        campaign: tuple[list[Result], list[Result]]) -> None:
    controls_run = [r for r in campaign[0] if is_control(r.mutant.spec)]
    assert controls_run
    bad = [f"{r.mutant.spec.label}: {r.outcome} {report.explain(r)}"
           for r in controls_run if r.outcome != "ok"]
    assert not bad, "real programs must load, run and inspect cleanly:\n" + "\n".join(bad)


def test_no_mutant_crashes_hangs_or_raises_an_untyped_error(
        campaign: tuple[list[Result], list[Result]], tmp_path: Path) -> None:
    results = [r for r in campaign[0] if not is_control(r.mutant.spec)]
    fig = report.figures(results)
    assert fig["mutants"] >= MUTANTS
    failing = report.failures(results)
    assert not failing, (
        f"{fig['crashes']} crashes, {fig['tracebacks']} tracebacks, {fig['hangs']} hangs, "
        f"{fig['memory_blowups']} memory blow-ups, {fig['wrong_answers']} wrong answers of "
        f"engines of {fig['mutants']} mutants:\n"
        + _explained(results, tmp_path))


def test_enough_mutants_get_past_the_loader_and_run(
        campaign: tuple[list[Result], list[Result]]) -> None:
    results = [r for r in campaign[0] if not is_control(r.mutant.spec)]
    fig = report.figures(results)
    assert fig["mutants_that_ran"] >= MIN_RAN * fig["mutants"], (
        f"only {fig['mutants_that_ran']} of {fig['mutants']} mutants ran a method to its end: "
        "a suite where the runtime refuses (nearly) everything tests nothing past the door\n"
        + report.table(fig))
    assert fig["loads_succeeded"] > 0 and fig["runs_completed"] > 0


def test_the_real_command_line_survives_a_sample(
        campaign: tuple[list[Result], list[Result]], tmp_path: Path) -> None:
    sampled = campaign[1]
    assert len(sampled) == CLI_SAMPLE
    assert all(r.stages or r.outcome == "hang" for r in sampled)
    assert not report.failures(sampled), _explained(sampled, tmp_path)
