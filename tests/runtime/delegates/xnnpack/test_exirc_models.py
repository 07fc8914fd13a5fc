"""Programs exirc itself lowered to XNNPACK (`--target xnnpack`) run on exirc's runtime
and agree with ExecuTorch's runtime and with eager PyTorch: the backend runs
our payloads as well as ExecuTorch's."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

from exirc.compiler import CompileOptions, CompileResult, compile_module
from tests.conftest import load_on
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.zoo import ZOO, eager, run_with_executorch_runtime

pytestmark = [requires_executorch, pytest.mark.oracle]

RTOL, ATOL = 1e-3, 1e-4


@functools.cache
def compiled(name: str) -> CompileResult:
    model = ZOO[name]
    dynamic = model.dynamic_shapes() if model.dynamic_shapes else None
    return compile_module(model.module(), model.inputs(), dynamic_shapes=dynamic,
                          options=CompileOptions(target="xnnpack"))


@pytest.mark.parametrize("name", list(ZOO))
def test_exirc_lowered_model_matches_executorch_and_eager(name: str, engine: str) -> None:
    model = ZOO[name]
    if model.needs and importlib.util.find_spec(model.needs) is None:
        pytest.skip(f"needs {model.needs}")
    result = compiled(name)
    delegated = sum(d.id == "XnnpackBackend" for plan in result.program.execution_plan
                    for d in plan.delegates)
    assert delegated, "exirc delegated nothing to XNNPACK"
    inputs = model.inputs()
    ours = load_on(engine, result.data).run("forward", list(inputs))
    for what, reference in (("ExecuTorch", run_with_executorch_runtime(result.data, inputs)),
                            ("eager", eager(model))):
        assert len(ours) == len(reference)
        for i, (a, b) in enumerate(zip(ours, reference)):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL,
                                       msg=f"{name} vs {what}: output {i}")
