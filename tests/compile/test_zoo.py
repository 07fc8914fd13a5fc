"""Conformance: every zoo model compiles for every built-in target, and the
program runs on exirc's runtime (and, where its kernels are all portable, on
ExecuTorch's portable runtime) with the outputs of eager PyTorch, at the
model's tolerance.

The zoo (`tests/models/zoo.py`) is the test set; compilation is memoized per
model and target, so the tests below share one compile of each.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest
import torch

from tests.conftest import load_on
from tests.models.zoo import (
    FAMILIES,
    HAVE_TRANSFORMERS,
    ZOO,
    ZOO_NAMES,
    ZooModel,
    flatten_outputs,
)
from tests.oracle import requires_executorch, run_with_executorch
from tests.targets import PORTABLE, VARIANTS, ZOO_TARGETS

if TYPE_CHECKING:
    from exirc.compiler import CompileResult

# The bar: the zoo's programs call at least this many distinct
# `aten::` operators (overloads folded).
MIN_DISTINCT_OPERATORS = 80
MIN_MODELS = 20


def _model(name: str) -> ZooModel:
    model = ZOO[name]
    if not model.available:
        pytest.skip(f"{name} needs {', '.join(model.requires)}, which is not installed")
    return model


def compiled(name: str, target: str = PORTABLE) -> CompileResult:
    """Zoo model `name` compiled for `target`, once per session.

    A failure is remembered too, and raised again to every test that asks,
    so a model the compiler rejects costs one compile, not one per test.
    """
    outcome = _compile_once(name, target)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@functools.cache
def _compile_once(name: str, target: str) -> CompileResult | Exception:
    from exirc.compiler import CompileOptions, compile_module

    model = ZOO[name]
    dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    try:
        return compile_module(
            model.module(), model.inputs(), dynamic_shapes=dynamic_shapes,
            options=CompileOptions(target=target),
        )
    except Exception as error:
        return error


def assert_matches_eager(got: Sequence[Any], model: ZooModel, runtime: str) -> None:
    want = model.reference_outputs()
    assert len(got) == len(want), f"{runtime}: {len(got)} outputs, eager PyTorch has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = torch.as_tensor(g)
        where = f"{model.name}, output {i} on {runtime}"
        assert g.dtype == w.dtype, f"{where}: dtype {g.dtype}, eager {w.dtype}"
        assert g.shape == w.shape, f"{where}: shape {tuple(g.shape)}, eager {tuple(w.shape)}"
        torch.testing.assert_close(
            g, w, rtol=model.rtol, atol=model.atol, equal_nan=True,
            msg=lambda message, where=where: f"{where}: {message}",
        )


def all_operator_names(result: CompileResult) -> set[str]:
    """`namespace::name` of every operator a compiled program calls."""
    return {op.name for plan in result.program.execution_plan for op in plan.operators}


def _portable_operator(name: str) -> bool:
    """Whether ExecuTorch's portable runtime has kernels for the operator's namespace."""
    return name.split("::")[0] in ("aten", "executorch_prim")


def aten_operator_names(result: CompileResult) -> set[str]:
    """`aten::name` of every operator a compiled program calls (no overload)."""
    return {
        op.name
        for plan in result.program.execution_plan
        for op in plan.operators
        if op.name.startswith("aten::")
    }


# --------------------------------------------------------------------------
# The zoo itself: checked without the compiler.
# --------------------------------------------------------------------------


def test_zoo_is_large_enough_and_covers_every_family() -> None:
    available = [m for m in ZOO.values() if m.available]
    without_optional = [m for m in ZOO.values() if not m.requires]
    assert len(without_optional) >= MIN_MODELS, "the zoo must not rely on optional packages"
    covered = {family for m in available for family in m.families}
    expected = {f for f in FAMILIES if f != "transformers" or HAVE_TRANSFORMERS}
    assert expected <= covered, f"families with no model: {sorted(expected - covered)}"
    unknown = {f for m in ZOO.values() for f in m.families} - set(FAMILIES)
    assert not unknown, f"unknown family tags: {sorted(unknown)}"


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_models_are_deterministic(name: str) -> None:
    model = _model(name)
    first, second = model.module(), model.module()
    assert not first.training
    for (key, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), f"{name}: {key} differs between two builds"
    for a, b in zip(model.inputs(), model.inputs()):
        assert torch.equal(a, b), f"{name}: example inputs differ between two calls"


# --------------------------------------------------------------------------
# Compiled programs.
# --------------------------------------------------------------------------


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", ZOO_TARGETS)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_compiled_program_runs_on_executorch_like_eager(name: str, target: str) -> None:
    model = _model(name)
    result = compiled(name, target)
    own = sorted(op for op in all_operator_names(result) if not _portable_operator(op))
    if target != PORTABLE and own:
        pytest.skip(f"ExecuTorch's runtime has no kernel for {', '.join(own)}")
    got = run_with_executorch(result.data, model.inputs())
    assert_matches_eager(got, model, f"ExecuTorch's portable runtime, target {target}")


@pytest.mark.parametrize("variant, base", sorted(VARIANTS.items()))
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_a_variant_target_compiles_a_model_without_its_pattern_as_its_base(
        name: str, variant: str, base: str) -> None:
    """Why the zoo-wide tests run a variant's base instead (tests.targets.VARIANTS)."""
    _model(name)
    assert compiled(name, variant).data == compiled(name, base).data, \
        f"{name}: --target {variant} changed a model the zoo runs only on {base}"


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_compiled_bytes_hold_the_compiled_program(name: str) -> None:
    from exirc.serialize import deserialize

    _model(name)
    result = compiled(name)
    read = deserialize(result.data)
    assert len(read.execution_plan) == len(result.program.execution_plan)
    for ours, theirs in zip(read.execution_plan, result.program.execution_plan):
        assert ours.operators == theirs.operators
        assert ours.non_const_buffer_sizes == theirs.non_const_buffer_sizes


@pytest.mark.parametrize("target", ZOO_TARGETS)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_memory_plan_is_not_below_its_lower_bound(name: str, target: str) -> None:
    _model(name)
    report = compiled(name, target).report
    assert 0 < report.lower_bound_bytes <= report.arena_bytes, (
        f"{name}: arena {report.arena_bytes} B, lower bound {report.lower_bound_bytes} B"
    )


@pytest.mark.slow
def test_zoo_programs_call_at_least_80_distinct_aten_operators() -> None:
    names = [name for name, model in ZOO.items() if model.available]
    covered: set[str] = set()
    failed = []
    for name in names:
        try:
            covered |= aten_operator_names(compiled(name))
        except Exception as error:  # report every model that fails, not the first
            failed.append(f"{name} ({type(error).__name__}: {str(error)[:100]})")
    assert not failed, "could not compile:\n  " + "\n  ".join(failed)
    assert len(covered) >= MIN_DISTINCT_OPERATORS, (
        f"{len(covered)} distinct aten operators across {len(names)} programs "
        f"(need {MIN_DISTINCT_OPERATORS}): {sorted(covered)}"
    )


@pytest.mark.parametrize("target", ZOO_TARGETS)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_no_two_live_tensors_share_bytes(name: str, target: str) -> None:
    """The inspector's own lifetimes, read off the emitted program, agree with the plan."""
    from exirc.inspector.memory_report import memory_report

    _model(name)
    warnings = [w.message for m in memory_report(compiled(name, target).program)
                for w in m.warnings]
    assert not warnings, f"{name}, target {target}: {warnings}"


@pytest.mark.parametrize("target", ZOO_TARGETS)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_compiled_program_runs_on_exirc_runtime_like_eager(name: str, target: str,
                                                          engine: str) -> None:
    model = _model(name)
    program = load_on(engine, compiled(name, target).data)
    got = flatten_outputs(program.run("forward", list(model.inputs())))
    assert_matches_eager(got, model, f"exirc's runtime ({engine}), target {target}")
