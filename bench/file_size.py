"""File sizes (issue 35): exirc's `.pte` against ExecuTorch's, per model and target.

For each model of the bench zoo (`side_by_side`'s), the zoo's GRU, the
16-step LSTM and GRU taggers (`tests/models/taggers.py`), a weight two
linears share and a tied embedding/LM head (`tests/models/tied_weights.py`),
and each target:
exirc's file (`--target portable`, `--target xnnpack`) beside ExecuTorch's
own (`to_edge(ep).to_executorch()`, and `to_edge_transform_and_lower(ep,
partitioner=[XnnpackPartitioner()])`), in bytes, and ours / theirs.

Also per row: the bytes of exirc's own metadata in our file (the
`exirc.metadata` segment: names, module paths and the stack traces every
instruction carries, what the size report, errors and `inspect` read;
ExecuTorch's files have none), measured as what
the file loses when it is written again without them (their table rows and
segment padding included), ours / theirs without them, and the duplicate
bytes the size report finds in each file (bytes stored more than once).
Geomean rows give ours / theirs per target, and name the models whose file
is larger than ExecuTorch's, with and without the metadata.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.common import Row
from bench.engines import HAVE_EXECUTORCH
from tests.models.zoo import ZooModel

TARGETS = ("portable", "xnnpack")
EXTRA_MODELS = ("gru_bidirectional",)


def run() -> list[Row]:
    if not HAVE_EXECUTORCH:
        return [{"note": "ExecuTorch not installed: nothing to compare against"}]
    rows = []
    for model in models():
        if model.available:
            rows += model_rows(model.name, model.module(), model.inputs())
    return rows + geomean_rows(rows)


def models() -> list[ZooModel]:
    from bench.side_by_side import bench_models
    from tests.models.taggers import TAGGERS
    from tests.models.tied_weights import TIED
    from tests.models.zoo import ZOO

    return [*bench_models(), *(ZOO[name] for name in EXTRA_MODELS), *TAGGERS.values(),
            *TIED.values()]


def model_rows(name: str, module: torch.nn.Module, inputs: tuple[Any, ...]) -> list[Row]:
    """One row per target: both files' bytes, and what ours holds besides the model."""
    from bench.common import executorch_file
    from exirc.compiler import CompileOptions, compile_module
    from exirc.inspector.size import size_report

    rows = []
    for target in TARGETS:
        row: Row = {"bench": "file_size.model", "model": name, "target": target}
        try:
            ours = compile_module(module, inputs, options=CompileOptions(target=target)).data
            theirs = executorch_file(module, inputs, xnnpack=target == "xnnpack")
        except Exception as error:  # a finding to report, not a reason to stop the bench
            row["note"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            rows.append(row)
            continue
        metadata = len(ours) - len(without_metadata(ours))
        row.update({
            "ours_bytes": len(ours),
            "et_bytes": len(theirs),
            "ours_vs_et": len(ours) / len(theirs),
            "ours_metadata_bytes": metadata,
            "without_metadata_vs_et": (len(ours) - metadata) / len(theirs),
            "ours_duplicate_bytes": size_report(ours).duplicate_bytes,
            "et_duplicate_bytes": size_report(theirs).duplicate_bytes,
        })
        rows.append(row)
    return rows


def without_metadata(data: bytes) -> bytes:
    """Our file written again without exirc's metadata: no `exirc.*` named
    data (their segments go too when they are the last ones, as exirc's
    writer numbers them) and no stack traces (the writer would put them in
    a new `exirc.metadata` segment)."""
    from exirc.serialize import deserialize, serialize

    program = deserialize(data)
    kept = [entry for entry in program.named_data if not entry.key.startswith("exirc.")]
    dropped = ({entry.segment_index for entry in program.named_data}
               - {entry.segment_index for entry in kept})
    program.named_data = kept
    while program.segments and len(program.segments) - 1 in dropped:
        program.segments.pop()
    for plan in program.execution_plan:
        for chain in plan.chains:
            chain.stacktrace = []
    return serialize(program)


def geomean_rows(rows: list[Row]) -> list[Row]:
    out = []
    for target in TARGETS:
        mine = [r for r in rows if r.get("target") == target and "ours_vs_et" in r]
        if not mine:
            continue
        larger = [r["model"] for r in mine if r["ours_vs_et"] > 1]
        larger_still = [r["model"] for r in mine if r["without_metadata_vs_et"] > 1]
        out.append({
            "bench": "file_size.geomean", "model": "geomean", "target": target,
            "ours_vs_et": _geomean([r["ours_vs_et"] for r in mine]),
            "without_metadata_vs_et": _geomean([r["without_metadata_vs_et"] for r in mine]),
            "ours_duplicate_bytes": sum(r["ours_duplicate_bytes"] for r in mine),
            "et_duplicate_bytes": sum(r["et_duplicate_bytes"] for r in mine),
            "note": f"larger than ExecuTorch's: {', '.join(larger) or 'none'}; "
                    f"without metadata: {', '.join(larger_still) or 'none'}",
        })
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
