"""The file-size bench section on one tiny model: the row it writes (both
files' bytes, our metadata, duplicates) and the geomean row, and our file
without exirc's metadata, which still runs as eager. No size assertions
beyond what the row must hold: the figures are `make bench`'s."""

from __future__ import annotations

import pytest
import torch

from bench import file_size
from exirc.compiler import CompileOptions, compile_module
from exirc.inspector.size import size_report
from exirc.runtime import load
from tests.models.zoo import ZOO
from tests.oracle import requires_executorch


@requires_executorch
@pytest.mark.oracle
def test_a_row_per_target_and_a_geomean() -> None:
    model = ZOO["mlp"]
    rows = file_size.model_rows("mlp", model.module(), model.inputs())
    assert [(r["model"], r["target"]) for r in rows] == [("mlp", "portable"), ("mlp", "xnnpack")]
    for row in rows:
        assert row["bench"] == "file_size.model"
        assert row["ours_vs_et"] == pytest.approx(row["ours_bytes"] / row["et_bytes"])
        # io names and module paths at least; stack traces on every instruction
        assert 0 < row["ours_metadata_bytes"] < row["ours_bytes"]
        assert row["without_metadata_vs_et"] < row["ours_vs_et"]
        assert row["ours_duplicate_bytes"] == 0
    geomean = file_size.geomean_rows(rows)
    assert [(r["model"], r["target"]) for r in geomean] == [("geomean", "portable"),
                                                          ("geomean", "xnnpack")]
    assert geomean[1]["ours_vs_et"] == pytest.approx(rows[1]["ours_vs_et"])


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_without_metadata_drops_names_and_stack_traces_only(target: str) -> None:
    model = ZOO["mlp"]
    data = compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target=target)).data
    stripped = file_size.without_metadata(data)
    assert len(stripped) < len(data)
    def metadata(report_of: bytes) -> list[str]:
        return [row.item for row in size_report(report_of).rows if row.kind == "stacktrace"
                or (row.kind == "named_data" and "'exirc." in row.item)]

    assert metadata(data) and not metadata(stripped)
    (got,) = load(stripped).run("forward", list(model.inputs()))
    torch.testing.assert_close(torch.as_tensor(got), model.reference_outputs()[0],
                               rtol=model.rtol, atol=model.atol)
