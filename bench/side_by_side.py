"""The side-by-side table (issue 14): every engine on the same models, in one run.

For each model of the bench zoo and each thread count (1, and all cores):
torch eager; exirc's compile for each target (`portable`, `exirc`,
`xnnpack`) run by exirc's runtime; ExecuTorch's own lowering, portable and
XNNPACK, run by its runtime, and its XNNPACK file run by exirc's runtime
(`exirc_et_file`: theirs on ours, not counted as an exirc target);
onnxruntime on torch.onnx's export where the model exports. Before timing,
each engine's outputs are checked against eager's (a loose tolerance: the
engines order float sums differently); an engine whose outputs differ is
still timed, but named in `mismatch` and left out of every ratio. An engine
that cannot run a model (not installed, the export or compile fails) gets no
time and the reason in `notes`.

Engines are timed in interleaved rounds (bench/interleave.py), so the load
of other processes falls on all of them alike; figures are medians, in ms.

Ratios are exirc / reference (below 1: exirc is faster): `exirc` names the
fastest exirc target whose outputs matched, and `vs_eager`, `vs_et_xnnpack`,
`vs_ort` compare it with each reference. Per thread count, geomean rows give
the same ratios for the best target, for each target alone and for
ExecuTorch's file on exirc (`et_file`), over the models where both figures
exist, and list the models slower than eager.

Threads: torch's setting covers eager and exirc's runtime (it computes with
torch); ExecuTorch's threadpool is set too but only its XNNPACK delegates
use it (its portable kernels are single-threaded); onnxruntime sessions get
`intra_op_num_threads`. Goals (issue 14): exirc <= 1.0x ExecuTorch+XNNPACK
and <= 1.0x onnxruntime in geomean, and no model slower than eager.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import Row  # noqa: E402
from bench.engines import (  # noqa: E402
    Eager,
    EngineFactory,
    EngineUnavailable,
    ExircRunOfExecuTorchFile,
    Inputs,
    OnnxRuntime,
    Outputs,
    Runner,
    executorch_engine,
    exirc_target,
    use_threads,
)
from bench.interleave import interleaved_medians  # noqa: E402
from tests.models.zoo import ZooModel, flatten_outputs  # noqa: E402

MODEL_NAMES = ["mlp", "resnet_tiny", "mobilenet_tiny", "squeezenet_tiny", "vit_tiny",
               "gpt2_lm_head", "bert", "lstm_tagger"]
EXIRC_TARGETS = ("portable", "exirc", "xnnpack")
ENGINES: dict[str, EngineFactory] = {
    "eager": Eager,
    **{f"exirc_{target}": exirc_target(target) for target in EXIRC_TARGETS},
    "exirc_et_file": ExircRunOfExecuTorchFile,
    "et_portable": executorch_engine(xnnpack=False),
    "et_xnnpack": executorch_engine(xnnpack=True),
    "ort": OnnxRuntime,
}
# Ratio column -> the engine exirc is compared with.
REFERENCES = {"vs_eager": "eager", "vs_et_xnnpack": "et_xnnpack", "vs_ort": "ort"}
RTOL, ATOL = 1e-3, 1e-3
BUDGET_SECONDS = 2.0  # of interleaved rounds, per model and thread count


def run() -> list[Row]:
    """Every bench model on every engine at each thread count, then the geomeans."""
    rows: list[Row] = []
    saved = torch.get_num_threads()
    try:
        for model in bench_models():
            if model.available:
                rows += model_rows(model.name, model.module(), model.inputs(), thread_counts())
    finally:
        use_threads(saved)
    return rows + geomean_rows(rows)


def bench_models() -> list[ZooModel]:
    from bench.squeezenet import SQUEEZENET_TINY
    from tests.models.zoo import ZOO

    known = {**ZOO, SQUEEZENET_TINY.name: SQUEEZENET_TINY}
    return [known[name] for name in MODEL_NAMES]


def thread_counts() -> list[int]:
    """One thread, and all the cores."""
    return sorted({1, os.cpu_count() or 1})


def model_rows(name: str, module: torch.nn.Module, inputs: Inputs, threads: Sequence[int],
               engines: Mapping[str, EngineFactory] = ENGINES,
               budget_seconds: float = BUDGET_SECONDS) -> list[Row]:
    """One row per thread count: each engine's median ms, the checks, the ratios."""
    rows = []
    with torch.no_grad():
        expected = [t.clone() for t in flatten_outputs(module(*inputs))]
        built, build_notes = {}, []
        for engine, factory in engines.items():
            try:
                built[engine] = factory(module, inputs)
            except EngineUnavailable as error:
                build_notes.append(f"{engine}: {error}")
        for count in threads:
            use_threads(count)  # before the runners: ExecuTorch's threadpool is replaced
            runners: dict[str, Runner] = {}
            wrong, notes = [], list(build_notes)
            for engine, built_engine in built.items():
                try:
                    runner = built_engine.runner(count)
                    difference = compare(runner(), expected)
                except Exception as error:  # an engine failing to run is reported, not fatal
                    notes.append(f"{engine}: {type(error).__name__}: {error}"[:200])
                    continue
                runners[engine] = runner
                if difference is not None:
                    wrong.append(engine)
                    notes.append(f"{engine}: {difference}")
            times = interleaved_medians(runners, budget_seconds)
            rows.append(_model_row(name, count, engines, times, wrong, notes))
    return rows


def compare(outputs: Outputs, expected: Outputs) -> str | None:
    """None if `outputs` match eager's within the bench tolerance, else what differs."""
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, eager gives {len(expected)}"
    for i, (got, want) in enumerate(zip(outputs, expected)):
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(want.shape):
            return f"output {i} has shape {tuple(got.shape)}, eager {tuple(want.shape)}"
        got, want = got.double(), want.double()
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            worst = (got - want).abs().max().item()
            return f"output {i} differs from eager (max abs diff {worst:.3g})"
    return None


def _model_row(name: str, threads: int, engines: Mapping[str, EngineFactory],
               seconds: Mapping[str, float], wrong: list[str], notes: list[str]) -> Row:
    row: Row = {"bench": "side_by_side.model", "model": name, "threads": threads}
    for engine in engines:
        row[f"{engine}_ms"] = seconds[engine] * 1e3 if engine in seconds else None
    row["mismatch"] = ",".join(wrong) or None
    best = _best_exirc(row)
    row["exirc"] = best
    for column, reference in REFERENCES.items():
        row[column] = _ratio(_valid_ms(row, f"exirc_{best}") if best else None,
                             _valid_ms(row, reference))
    row["notes"] = "; ".join(notes) or None
    return row


def _valid_ms(row: Row, engine: str) -> float | None:
    """The engine's time in `row`, unless it was not measured or its outputs were wrong."""
    if engine in (row.get("mismatch") or "").split(","):
        return None
    value = row.get(f"{engine}_ms")
    return value if isinstance(value, float) else None


def _best_exirc(row: Row) -> str | None:
    timed = {t: ms for t in EXIRC_TARGETS if (ms := _valid_ms(row, f"exirc_{t}")) is not None}
    return min(timed, key=lambda target: timed[target]) if timed else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def geomean_rows(rows: Sequence[Row]) -> list[Row]:
    """Per thread count: the geomean of each ratio for the best target and for each target."""
    summary = []
    model_rows_only = [r for r in rows if r["bench"] == "side_by_side.model"]
    for threads in sorted({r["threads"] for r in model_rows_only}):
        at = [r for r in model_rows_only if r["threads"] == threads]
        for variant in ("best", *EXIRC_TARGETS, "et_file"):
            row: Row = {"bench": "side_by_side.geomean", "model": "geomean",
                        "threads": threads, "exirc": variant}
            slower = []
            for column, reference in REFERENCES.items():
                ratios = []
                for model_row in at:
                    target = model_row["exirc"] if variant == "best" else variant
                    ratio = _ratio(_valid_ms(model_row, f"exirc_{target}") if target else None,
                                   _valid_ms(model_row, reference))
                    if ratio is None:
                        continue
                    ratios.append(ratio)
                    if reference == "eager" and ratio > 1:
                        slower.append(model_row["model"])
                row[column] = statistics.geometric_mean(ratios) if ratios else None
            row["slower_than_eager"] = ",".join(slower) or "none"
            summary.append(row)
    return summary


if __name__ == "__main__":
    from bench.run import format_table

    print(format_table(run()))
