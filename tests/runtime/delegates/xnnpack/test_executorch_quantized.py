"""Quantized programs ExecuTorch lowered to XNNPACK run in exirc, and agree with
ExecuTorch's runtime.

Integer arithmetic is reproduced exactly, so static graphs agree bit for bit
where the delegate's inputs agree; dynamically quantized ones within float32
rounding of the final scaling. The exception is a graph where a float value
computed outside the delegate (by a portable kernel, whose last bit may
differ from ATen's) is quantized inside it: a last-bit difference there can
move one integer by one step, which shows as one quantization step of the
output (tiny_vit: its layer norms run outside XNNPACK).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import pytest
import torch

from exirc.runtime import load
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.quantized_zoo import (
    PT2E_MODELS,
    PT2E_SCHEMES,
    int4_inputs,
    int4_module,
    int4_pte,
    pt2e_pte,
)
from tests.runtime.delegates.xnnpack.zoo import ZOO, eager, run_with_executorch_runtime

pytestmark = [requires_executorch, pytest.mark.oracle,
              pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                 reason="needs torchao (ExecuTorch's quantization flow)")]

# One quantization step of tiny_vit's outputs (see the module docstring).
LOOSER = {("tiny_vit", "static_per_channel"): 1e-2, ("tiny_vit", "static_per_tensor"): 1e-2}


def assert_agree(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor], atol: float,
                 what: str) -> None:
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: output {i}"
        torch.testing.assert_close(a, b, rtol=1e-3, atol=atol, msg=f"{what}: output {i}")


def assert_near_float(ours: Sequence[torch.Tensor], reference: Sequence[torch.Tensor],
                      what: str) -> None:
    """Quantization error only: within a tenth of each output's range."""
    for i, (a, b) in enumerate(zip(ours, reference)):
        scale = float(b.abs().max()) + 1e-3
        assert float((a - b).abs().max()) <= 0.1 * scale + 0.02, f"{what}: output {i}"


@pytest.mark.slow
@pytest.mark.parametrize("scheme", list(PT2E_SCHEMES))
@pytest.mark.parametrize("name", PT2E_MODELS)
def test_pt2e_quantized_model_matches_executorch(name: str, scheme: str) -> None:
    pte = pt2e_pte(name, scheme)
    inputs = ZOO[name].inputs()
    ours = load(pte).run("forward", list(inputs))
    theirs = run_with_executorch_runtime(pte, inputs)
    assert_agree(ours, theirs, LOOSER.get((name, scheme), 1e-5), f"{name} {scheme}")
    assert_near_float(ours, eager(ZOO[name]), f"{name} {scheme} vs float eager")


@pytest.mark.parametrize("granularity", ["group", "channel"])
def test_int4_weight_linears_match_executorch(granularity: str) -> None:
    pte, quantized = int4_pte(granularity)
    program = load(pte)
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        x = (torch.randn(5, 64, generator=generator) * (seed + 1),)
        ours = program.run("forward", list(x))
        assert_agree(ours, run_with_executorch_runtime(pte, x), 1e-5, f"int4 {granularity}")
    with torch.no_grad():
        assert_near_float(program.run("forward", list(int4_inputs())),
                          [int4_module(granularity)(*int4_inputs())], "int4 vs float")
