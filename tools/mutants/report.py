"""The campaign's figures, its failures grouped by cause, and their reproducers.

Figures are what issue 16 asks to paste: mutants (outcomes count the
unmutated controls and the real-command sample too), typed errors by code, loads
that succeeded, runs that completed, crashes, tracebacks, hangs, time per
mutant (p50, p99) and peak memory. Failures (anything but `ok` or `typed`)
are grouped by a signature (outcome, stage, first error line with numbers
and names blurred), one reproducer each.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.mutants.generate import is_control
from tools.mutants.runner import MEMORY_SIGNS, Result

FAILURES = ("crash", "hang", "traceback", "memory", "harness", "wrong")


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def figures(results: Sequence[Result], wall_seconds: float | None = None) -> dict[str, Any]:
    outcomes = Counter(result.outcome for result in results)
    codes: Counter[str] = Counter()
    loads = load_attempts = runs = run_attempts = ran = 0
    for result in results:
        ran_once = False
        for stage in result.stages:
            if stage.outcome not in ("ok", "skipped", "traceback", "harness", "wrong"):
                codes[stage.outcome] += 1
            if stage.name == "load":
                load_attempts += 1
                loads += stage.outcome == "ok"
            elif stage.name.startswith(("run ", "exirc run --method")) \
                    and stage.outcome != "skipped":
                run_attempts += 1
                runs += stage.outcome == "ok"
                ran_once = ran_once or stage.outcome == "ok"
        ran += ran_once
    # Time and memory of the forked mutants: the real-CLI sample's also count
    # starting an interpreter and importing torch.
    forked = [result for result in results if not _through_cli(result)]
    seconds = [result.seconds for result in forked]
    rss = [result.peak_rss_kib for result in forked if result.peak_rss_kib]
    controls = sum(is_control(result.mutant.spec) for result in forked)
    return {
        "mutants": len(forked) - controls, "controls": controls,
        "outcomes": dict(sorted(outcomes.items())),
        "typed_errors": dict(sorted(codes.items())),
        "loads_succeeded": loads, "loads_attempted": load_attempts,
        "runs_completed": runs, "runs_attempted": run_attempts,
        "mutants_that_ran": ran,
        "through_real_cli": len(results) - len(forked),
        "crashes": outcomes["crash"], "tracebacks": outcomes["traceback"],
        "hangs": outcomes["hang"], "memory_blowups": outcomes["memory"],
        "harness_errors": outcomes["harness"],
        "wrong_answers": outcomes["wrong"],  # an engine's answer, not the reference's
        "seconds_p50": round(percentile(seconds, 0.5), 3),
        "seconds_p99": round(percentile(seconds, 0.99), 3),
        "seconds_max": round(max(seconds, default=0.0), 3),
        "peak_rss_mib_p99": round(percentile(rss, 0.99) / 1024, 1),
        "peak_rss_mib_max": round(max(rss, default=0) / 1024, 1),
        "slowest": max(forked, key=lambda r: r.seconds).mutant.spec.label if forked else None,
        "largest": max(forked, key=lambda r: r.peak_rss_kib or 0).mutant.spec.label
        if forked else None,
        "wall_seconds": round(wall_seconds, 1) if wall_seconds is not None else None,
    }


def _through_cli(result: Result) -> bool:
    return any(stage.name.startswith("process:") for stage in result.stages)


def table(fig: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    rows = [
        ("mutants", f"{fig['mutants']} (+ {fig['controls']} unmutated controls; "
                    f"{fig['through_real_cli']} of them also through the real `exirc` command)"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in fig["outcomes"].items())),
        ("typed errors (by code, per stage)",
         ", ".join(f"{k} {v}" for k, v in fig["typed_errors"].items()) or "none"),
        ("loads that succeeded", f"{fig['loads_succeeded']} of {fig['loads_attempted']}"),
        ("runs that completed", f"{fig['runs_completed']} of {fig['runs_attempted']}"),
        ("mutants that ran at least once", fig["mutants_that_ran"]),
        ("crashes", fig["crashes"]), ("tracebacks", fig["tracebacks"]),
        ("hangs", fig["hangs"]), ("memory blow-ups", fig["memory_blowups"]),
        ("time per mutant (forked) p50 / p99 / max",
         f"{fig['seconds_p50']} / {fig['seconds_p99']} / {fig['seconds_max']} s"),
        ("peak RSS p99 / max", f"{fig['peak_rss_mib_p99']} / {fig['peak_rss_mib_max']} MiB"),
        ("slowest / largest mutant", f"`{fig['slowest']}` / `{fig['largest']}`"),
    ]
    if fig.get("wall_seconds") is not None:
        rows.append(("wall time", f"{fig['wall_seconds']} s"))
    if fig.get("harness_errors"):
        rows.append(("harness errors", fig["harness_errors"]))
    return "\n".join(["| figure | value |", "|---|---|"]
                     + [f"| {name} | {value} |" for name, value in rows])


def failures(results: Sequence[Result]) -> list[Result]:
    return [result for result in results if result.outcome in FAILURES]


def crash_frame(log: str) -> str:
    """The innermost Python frame of a faulthandler dump ('' if none)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "most recent call first" in line:
            for frame in lines[i + 1:]:
                if frame.strip().startswith("File "):
                    return frame.strip()
    return ""


def _frame(line: str) -> str:
    """`File "/x/y/size_spans.py", line 35, in _vector` as `size_spans.py:35 (_vector)`."""
    # Tracebacks write `line 35, in _vector`; faulthandler `line 35 in _vector`.
    match = re.search(r'File "([^"]*)", line (\d+),? in (\S+)', line)
    if match is None:
        return line.strip()
    return f"{Path(match.group(1)).name}:{match.group(2)} ({match.group(3)})"


def problems(result: Result) -> list[str]:
    """Every failure of a mutant, a line each: its crash or hang, and each stage
    that raised an untyped error or whose typed error hid a memory blow-up."""
    found = []
    for stage in result.stages:
        if stage.outcome == "traceback" or stage.outcome == "harness":
            frames = [line for line in stage.trace.splitlines()
                      if line.strip().startswith("File ")]
            where = f" at {_frame(frames[-1])}" if frames else ""
            given = f" — given {stage.note}" if stage.note else ""
            found.append(f"{stage.outcome} in {stage.name}: {stage.detail}{where}{given}")
        elif any(sign in stage.detail for sign in MEMORY_SIGNS):
            found.append(f"memory in {stage.name}: {stage.outcome} {stage.detail}")
    if result.outcome == "crash":
        frame = crash_frame(result.log)
        signal = -result.exit_code if result.exit_code and result.exit_code < 0 else None
        what = f"signal {signal}" if signal else f"exit {result.exit_code}"
        found.append(f"crash ({what}) in {result.last_stage or '?'}"
                     + (f", {result.site}" if result.site else "")
                     + (f" at {_frame(frame)}" if frame else ""))
    elif result.outcome == "hang":
        found.append(f"hang (killed: {result.killed_for or 'over its budget'}) in "
                     f"{result.last_stage or '?'}")
    return found


def explain(result: Result) -> str:
    """One line: what went wrong, and where."""
    return "; ".join(problems(result)) or result.first_error


def signature(problem: str) -> str:
    """What groups failures with one cause: the problem with numbers, quoted
    names and method names blurred."""
    text = re.sub(r" — given .*$", "", problem)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"\[[^\]]*\]", "[…]", text)
    text = re.sub(r"(--method|run|method) \S+", r"\1 …", text)
    return text[:240]


def group(results: Sequence[Result]) -> dict[str, list[tuple[Result, str]]]:
    """Failures by signature; a mutant with two problems is in two groups."""
    groups: dict[str, list[tuple[Result, str]]] = {}
    for result in failures(results):
        for problem in problems(result) or [result.first_error]:
            groups.setdefault(signature(problem), []).append((result, problem))
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


def failure_lines(results: Sequence[Result], limit: int = 40) -> list[str]:
    """A line per failing mutant: base, mutation, outcome, first error line."""
    lines = []
    for result in failures(results)[:limit]:
        lines.append(f"[{result.mutant.spec.label}] {result.mutant.description[:200]} -> "
                     f"{explain(result)[:300]}")
    return lines


def save_reproducers(results: Sequence[Result], folder: Path) -> dict[str, Path]:
    """Each failing mutant's bytes as `<index>-<base>-<kinds>.pte`; path by label."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = {}
    for result in failures(results):
        spec = result.mutant.spec
        path = folder / f"{result.index}-{spec.base}-{'+'.join(spec.kinds)}.pte"
        path.write_bytes(result.mutant.data)
        saved[spec.label] = path
    return saved


def findings_markdown(results: Sequence[Result], fig: dict[str, Any],
                      saved: dict[str, Path]) -> str:
    parts = ["## Figures", "", table(fig), "", "## Failures by signature", ""]
    groups = group(results)
    for sig, members in groups.items():
        first, problem = members[0]
        parts.append(f"### {len(members)} × {sig}")
        parts.append("")
        parts.append(f"- example: `{first.mutant.spec.label}` — {first.mutant.description[:300]}")
        parts.append(f"- error: {problem[:400]}")
        path = saved.get(first.mutant.spec.label)
        if path is not None:
            parts.append(f"- reproducer: `{path}` (route {first.mutant.spec.route})")
        others = ", ".join(f"`{m.mutant.spec.label}`" for m, _ in members[1:4])
        if others:
            parts.append(f"- also: {others}")
        parts.append("")
    if not groups:
        parts.append("none")
    return "\n".join(parts)


def to_json(results: Sequence[Result], fig: dict[str, Any]) -> str:
    return json.dumps({
        "figures": fig,
        "failures": [{"label": r.mutant.spec.label, "description": r.mutant.description,
                      "outcome": r.outcome, "problems": problems(r),
                      "stages": [vars(s) for s in r.stages], "log": r.log[-2000:]}
                     for r in failures(results)],
    }, indent=2)
