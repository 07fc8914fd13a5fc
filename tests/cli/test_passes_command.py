"""`exirc passes` and the pass registry it reads: each pass documents itself."""

from __future__ import annotations

import json

import pytest

from exirc.cli.app import main
from exirc.passes.pipeline import STAGES
from exirc.pipelines import BUILTIN_PASSES, load_pipeline
from tests.targets import TARGETS


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_registry_names_each_pass_by_its_own_name_and_file() -> None:
    for name, cls in BUILTIN_PASSES.items():
        assert cls.name == name
        # One file per pass, named after the pass, in the folder of its stage.
        assert cls.__module__.rsplit(".", 1)[1] == name, cls.__module__
        assert cls.__module__.split(".")[1] in STAGES


@pytest.mark.parametrize("target", TARGETS)
def test_every_pass_of_a_default_pipeline_is_registered(target: str) -> None:
    for stage in load_pipeline(target).stages.values():
        for p in stage:
            assert BUILTIN_PASSES[p.name] is type(p)


def test_every_pass_docstring_opens_with_the_dialects_it_takes_and_returns() -> None:
    for name, cls in BUILTIN_PASSES.items():
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        assert "->" in summary, f"{name}: {summary!r}"


def test_the_listing_shows_every_pass_with_its_summary_and_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "passes")
    assert code == 0, err
    for name, cls in BUILTIN_PASSES.items():
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        assert f"  {name}" in out and summary in out
    assert "option max_bytes: int = 16777216" in out
    assert out.index("to_edge") < out.index("sym_prims") < out.index("memory_plan")


def test_one_pass_shows_its_whole_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "passes", "memory_plan")
    assert code == 0
    assert out.startswith("memory_plan (plan stage, exirc.plan.memory_plan:MemoryPlanPass)")
    assert "prove" in out and "algorithm: str = 'greedy_best'" in out


def test_json_lists_the_same_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "passes", "--json")
    assert code == 0
    passes = json.loads(out)["passes"]
    assert [p["name"] for p in passes] == list(BUILTIN_PASSES)
    fold = next(p for p in passes if p["name"] == "constant_fold")
    assert fold["stage"] == "edge"
    assert fold["options"] == [{"name": "max_bytes", "type": "int", "default": 16777216}]


def test_an_unknown_pass_is_a_usage_error_listing_the_known(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "passes", "constant_folding")
    assert code == 2
    assert "no built-in pass 'constant_folding'" in err and "constant_fold" in err
