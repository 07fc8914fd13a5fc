"""The side-by-side bench's machinery on one tiny model, with a tiny time
budget: the row it writes, the correctness check that keeps a wrong engine
out of the ratios, and a missing onnxruntime reported as "-" with a reason.
No timing assertions: the numbers are `make bench`'s business."""

from __future__ import annotations

import sys

import pytest
import torch

from bench import side_by_side
from bench.engines import Eager, Inputs, Runner, exirc_target
from tests.models.zoo import ZOO
from tests.oracle import requires_executorch


class OffByOne:
    """An engine that runs fast and answers wrong: eager's outputs plus one."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs) -> None:
        self.eager = Eager(module, inputs)

    def runner(self, threads: int) -> Runner:
        run = self.eager.runner(threads)
        return lambda: [t + 1 for t in run()]


def _rows(engines: dict) -> list[dict]:
    model = ZOO["mlp"]
    return side_by_side.model_rows("mlp", model.module(), model.inputs(), [1],
                                   engines=engines, budget_seconds=0.02)


def test_a_wrong_engine_is_flagged_and_kept_out_of_the_ratios() -> None:
    # Named like an exirc target: were it trusted, it would be the "best" one.
    engines = {"eager": Eager, "exirc_portable": exirc_target("portable"),
               "exirc_exirc": OffByOne}
    (row,) = _rows(engines)

    assert row["bench"] == "side_by_side.model" and row["model"] == "mlp"
    assert row["threads"] == 1
    assert all(row[f"{engine}_ms"] > 0 for engine in engines)  # the wrong one is still timed
    assert row["mismatch"] == "exirc_exirc"
    assert "exirc_exirc: output 0 differs from eager (max abs diff 1)" in row["notes"]
    assert row["exirc"] == "portable"
    assert row["vs_eager"] == pytest.approx(row["exirc_portable_ms"] / row["eager_ms"])
    assert row["vs_et_xnnpack"] is None and row["vs_ort"] is None  # not run here

    by_variant = {r["exirc"]: r for r in side_by_side.geomean_rows([row])}
    assert by_variant["best"]["vs_eager"] == pytest.approx(row["vs_eager"])
    assert by_variant["exirc"]["vs_eager"] is None  # its only figure was wrong
    assert by_variant["xnnpack"]["vs_eager"] is None  # never measured


def test_without_onnxruntime_the_column_is_empty_and_the_row_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    (row,) = _rows({"eager": Eager, "ort": side_by_side.OnnxRuntime})

    assert row["ort_ms"] is None
    assert "ort: onnxruntime is not installed (pip install '.[bench]')" in row["notes"]
    assert row["mismatch"] is None


def test_onnxruntime_runs_the_exported_model_and_matches_eager() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    (row,) = _rows({"eager": Eager, "ort": side_by_side.OnnxRuntime})

    assert row["ort_ms"] > 0
    assert row["mismatch"] is None and row["notes"] is None


def test_the_bench_zoo_has_the_models_issue_14_names() -> None:
    names = [model.name for model in side_by_side.bench_models()]
    assert names == ["mlp", "resnet_tiny", "mobilenet_tiny", "squeezenet_tiny", "vit_tiny",
                     "gpt2_lm_head", "bert", "lstm_tagger"]
    squeezenet = side_by_side.bench_models()[3]
    assert squeezenet.reference_outputs()[0].shape == (1, 10)


@requires_executorch
def test_executorch_files_on_exirc_are_their_own_column_not_a_target() -> None:
    engines = {"eager": Eager, "exirc_portable": exirc_target("portable"),
               "et_xnnpack": side_by_side.executorch_engine(xnnpack=True),
               "exirc_et_file": side_by_side.ExircRunOfExecuTorchFile}
    (row,) = _rows(engines)
    assert row["mismatch"] is None and row["exirc_et_file_ms"] > 0
    assert row["exirc"] == "portable"  # theirs on ours is never "the best exirc target"
    by_variant = {r["exirc"]: r for r in side_by_side.geomean_rows([row])}
    assert by_variant["et_file"]["vs_et_xnnpack"] == pytest.approx(
        row["exirc_et_file_ms"] / row["et_xnnpack_ms"])
