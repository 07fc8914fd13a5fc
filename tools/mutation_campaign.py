"""The runtime mutation campaign: thousands of mutants of real programs, each
in its own process with a CPU-time budget and a memory limit (`make fuzz`).

    python -m tools.mutation_campaign --mutants 12000 --seed 1 --jobs 2 --out out/mutants
    python -m tools.mutation_campaign --replay 'mlp.portable/memory_offset/123/api'

Prints the figures (mutants, typed errors by code, loads and runs that
succeeded, crashes, tracebacks, hangs, p50/p99 time, peak memory) and writes
them with every failure to DIR/campaign.json, the failures grouped by cause
to DIR/findings.md, and each failing mutant to DIR/repro/. Exit status 1 if
anything crashed, hung, raised a raw exception or blew the memory limit, or
if an unmutated base program failed. `--replay LABEL` reruns one mutant by
its label (as the reports print it) and shows each stage; `--in-process`
runs it here instead, so a raw exception prints its whole traceback.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tools.mutants import report
from tools.mutants.bases import ALL_BASES, TEST_BASES, available
from tools.mutants.catalog import Catalog
from tools.mutants.child import Limits
from tools.mutants.cli_sample import run_sample
from tools.mutants.generate import (
    Mutant,
    Spec,
    controls,
    hostile_probes,
    is_control,
    make_mutant,
    plan_mutants,
)
from tools.mutants.runner import CPU_BUDGET, WALL_CAP_FACTOR, Result, run_mutants
from tools.mutants.session import prepare

BASE_SETS = {"all": ALL_BASES, "test": TEST_BASES}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.replay:
        return _replay(args)
    names = available(BASE_SETS.get(args.bases) or args.bases.split(","))
    started = time.monotonic()
    print(f"building {len(names)} base programs...", file=sys.stderr)
    session = prepare(names, Path(args.out) / "bases-cache")
    bases, catalog = session.bases, session.catalog
    unmutated = controls(names)
    specs = unmutated + hostile_probes(names) + plan_mutants(names, args.mutants, args.seed)
    limits = Limits(memory_bytes=int(args.memory_gib * (1 << 30)), max_steps=args.max_steps)
    print(f"running {len(specs)} mutants ({len(unmutated)} of them unmutated controls), "
          f"{args.jobs} at a time...", file=sys.stderr)
    progress = _Progress(len(specs))
    results = run_mutants(_mutants(specs, bases, catalog), jobs=args.jobs,
                          cpu_budget=args.cpu_budget, limits=limits,
                          warm_modules=session.warm_modules,
                          on_result=progress)
    sample = random.Random(args.seed).sample(range(len(specs)), min(args.cli_sample, len(specs)))
    print(f"running {len(sample)} mutants through the real command line...", file=sys.stderr)
    results += run_sample([(len(specs) + i, make_mutant(specs[i], bases[specs[i].base], catalog))
                           for i in sample], runs=args.cli_sample // 2, jobs=args.jobs)
    return _report(results, names, time.monotonic() - started, Path(args.out))


def _mutants(specs: Sequence[Spec], bases: dict[str, bytes], catalog: Catalog
             ) -> Iterator[tuple[int, Mutant]]:
    """Made as the runner asks for them: the parent is idle while children run."""
    for index, spec in enumerate(specs):
        yield index, make_mutant(spec, bases[spec.base], catalog)


class _Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.bad = total, 0, 0
        self.every = max(1, total // 20)

    def __call__(self, result: Result) -> None:
        self.done += 1
        if result.outcome in report.FAILURES:
            self.bad += 1
            print(f"  {result.outcome}: [{result.mutant.spec.label}] "
                  f"{report.explain(result)[:160]}", file=sys.stderr)
        if self.done % self.every == 0 or self.done == self.total:
            print(f"{self.done}/{self.total} mutants, {self.bad} failing", file=sys.stderr)


def _report(results: list[Result], names: Sequence[str], wall: float, out: Path) -> int:
    fig = report.figures(results, wall)
    fig["bases"] = list(names)
    out.mkdir(parents=True, exist_ok=True)
    saved = report.save_reproducers(results, out / "repro")
    (out / "campaign.json").write_text(report.to_json(results, fig))
    (out / "findings.md").write_text(report.findings_markdown(results, fig, saved))
    print(report.table(fig))
    broken_bases = [r for r in results if is_control(r.mutant.spec) and r.outcome != "ok"]
    for result in broken_bases:
        print(f"unmutated base failed: [{result.mutant.spec.label}] {report.explain(result)}")
    print(f"\n{len(report.group(results))} distinct failures; details in {out / 'findings.md'}")
    return 1 if report.failures(results) or broken_bases else 0


def _replay(args: argparse.Namespace) -> int:
    spec = Spec.parse(args.replay)
    out = Path(args.out)
    session = prepare([spec.base], out / "bases-cache")
    mutant = make_mutant(spec, session.bases[spec.base], session.catalog)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"replay-{spec.base}-{'+'.join(spec.kinds)}-{spec.seed}.pte"
    path.write_bytes(mutant.data)
    print(f"{spec.label}: {mutant.description}\nwritten to {path}")
    if args.in_process:
        from tools.mutants.child import replay_here

        replay_here(mutant.data, spec.route, spec.seed, Limits(max_steps=args.max_steps))
        return 0
    result = run_mutants([(0, mutant)], jobs=1, cpu_budget=args.cpu_budget,
                         warm_modules=session.warm_modules)[0]
    for stage in result.stages:
        print(f"  {stage.name}: {stage.outcome} {stage.detail}")
    print(f"outcome: {result.outcome} {report.explain(result)}")
    if result.log:
        print(result.log)
    return 0 if result.outcome not in report.FAILURES else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.mutation_campaign",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mutants", type=int, default=12_000, help="how many (default 12000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="processes at once (default 2)")
    parser.add_argument("--out", default="out/mutants", help="where reports go")
    parser.add_argument("--bases", default="all",
                        help="'all', 'test', or a comma-separated list of <model>.<flavour>")
    parser.add_argument("--cpu-budget", type=float, default=CPU_BUDGET,
                        help="CPU seconds a stage of a mutant may spend before it is killed "
                             f"as hung (default {CPU_BUDGET:g}); one making no progress is "
                             f"killed after {WALL_CAP_FACTOR} budgets of wall-clock time")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address space limit")
    parser.add_argument("--max-steps", type=int, default=Limits.max_steps,
                        help="instructions one run may execute (the runtime's step budget)")
    parser.add_argument("--cli-sample", type=int, default=100,
                        help="mutants also run through the real `exirc` command")
    parser.add_argument("--replay", metavar="LABEL", help="rerun one mutant by its label")
    parser.add_argument("--in-process", action="store_true",
                        help="with --replay: run here, showing a raw exception's traceback")
    return parser


if __name__ == "__main__":
    sys.exit(main())
