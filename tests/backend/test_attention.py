"""`--target exirc` keeps scaled_dot_product_attention whole (exirc.backend.attention):
eager's outputs, the calls it must leave decomposed, and a kernel that refuses
malformed arguments."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exirc.backend import attention as compiler_attention
from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels import attention as runtime_attention
from exirc.runtime.kernels.registry import KERNELS


class Attention(nn.Module):
    """F.scaled_dot_product_attention of its inputs (a mask if given), with `options`."""

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.options = options

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                *mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.options) * 2


def compiled(module: nn.Module, inputs: tuple[torch.Tensor, ...], target: str = "exirc"
             ) -> tuple[torch.Tensor, list[str]]:
    """The target's output on `inputs` and the program's operator names."""
    program = load(compile_module(module, inputs, options=CompileOptions(target=target)).data)
    operators = [op.name for op in program.program.execution_plan[0].operators]
    return program.run("forward", list(inputs))[0], operators


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def qkv(batch: int, heads: int, length: int, size: int, positions: int | None = None,
        value_size: int | None = None, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Query, key and value drawn from `seed` (the cases are made at import time, before
    any test seeds torch)."""
    positions, random = positions or length, seeded(seed)
    return (torch.randn(batch, heads, length, size, generator=random),
            torch.randn(batch, heads, positions, size, generator=random),
            torch.randn(batch, heads, positions, value_size or size, generator=random))


CASES = [
    # (inputs, options)
    (qkv(1, 2, 17, 16), {}),
    (qkv(3, 4, 5, 8, positions=7, value_size=6, seed=1), {}),
    (qkv(2, 3, 6, 8, seed=2), {"scale": 0.3}),
    (qkv(2, 2, 6, 8, seed=3), {"is_causal": True}),
    ((*qkv(2, 2, 5, 4, positions=6, seed=4), torch.rand(5, 6, generator=seeded(5)) > 0.3), {}),
    ((*qkv(2, 2, 5, 4, seed=6), torch.randn(2, 1, 5, 5, generator=seeded(7))), {"scale": 1.5}),
    (tuple(t[0, 0] for t in qkv(1, 1, 5, 4, seed=8)), {}),  # no batch dims
]


@pytest.mark.parametrize(("inputs", "options"), CASES)
def test_attention_runs_as_one_call_with_eagers_outputs(inputs: tuple[torch.Tensor, ...],
                                                        options: dict[str, Any]) -> None:
    module = Attention(**options)
    got, operators = compiled(module, inputs)
    assert "exirc::attention" in operators
    assert "aten::bmm" not in operators and "aten::_softmax" not in operators
    torch.testing.assert_close(got, module(*inputs), rtol=1e-5, atol=1e-6)


def test_a_fully_masked_row_gives_zeros_as_eager_does() -> None:
    q, k, v = qkv(1, 2, 3, 4)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    got, operators = compiled(Attention(), (q, k, v, mask))
    assert "exirc::attention" in operators
    assert (got[:, :, 1] == 0).all()
    torch.testing.assert_close(got, Attention()(q, k, v, mask))


@pytest.mark.parametrize(("inputs", "options"), [
    (qkv(1, 2, 4, 8), {"dropout_p": 0.5}),              # training dropout
    ((torch.randn(1, 4, 5, 8), *qkv(1, 2, 5, 8)[1:]), {"enable_gqa": True}),  # GQA
    ((torch.randn(2, 2, 5, 8), *qkv(1, 2, 5, 8)[1:]), {}),  # broadcast batch dims
])
def test_calls_it_cannot_match_exactly_stay_decomposed(inputs: tuple[torch.Tensor, ...],
                                                       options: dict[str, Any]) -> None:
    program = compile_module(Attention(**options), inputs,
                             options=CompileOptions(target="exirc")).data
    operators = [op.name for op in load(program).program.execution_plan[0].operators]
    assert "exirc::attention" not in operators and "aten::bmm" in operators


def test_the_portable_target_still_decomposes_attention() -> None:
    inputs = qkv(1, 2, 4, 8)
    got, operators = compiled(Attention(), inputs, target="portable")
    assert "exirc::attention" not in operators
    torch.testing.assert_close(got, Attention()(*inputs), rtol=1e-5, atol=1e-6)


def test_compiler_and_runtime_agree_on_the_schema() -> None:
    assert compiler_attention.ATTENTION_OUT_SCHEMA == runtime_attention.ATTENTION_OUT_SCHEMA
    kernel = KERNELS.find("exirc::attention", "out")
    assert kernel is not None and kernel.fn is runtime_attention.attention_out


def _arguments(**changes: Any) -> dict[str, Any]:
    """Well-formed arguments: batch 1, 2 heads, 3 queries, 5 positions, head size 4."""
    q, k, v = qkv(1, 2, 3, 4, positions=5)
    arguments: dict[str, Any] = dict(query=q, key=k, value=v, attn_mask=None, is_causal=False,
                                     scale=0.5, out=torch.full((1, 2, 3, 4), 7.0))
    arguments.update(changes)
    return arguments


def test_the_kernel_computes_torchs_attention() -> None:
    mask = torch.rand(3, 5) > 0.2
    arguments = _arguments(attn_mask=mask)
    runtime_attention.attention_out(**arguments)
    want = F.scaled_dot_product_attention(arguments["query"], arguments["key"],
                                          arguments["value"], mask, scale=0.5)
    torch.testing.assert_close(arguments["out"], want)


@pytest.mark.parametrize(("changes", "words"), [
    ({"query": torch.randint(0, 3, (1, 2, 3, 4))}, "must be float32 or float64"),
    ({"key": torch.randn(1, 2, 5, 4, dtype=torch.float64)}, "key is torch.float64"),
    ({"value": torch.randn(2, 5, 4)}, "value has 3 dims, but query has 4"),
    ({"key": torch.randn(1, 3, 5, 4)}, "key has batch dims [1, 3], but query has [1, 2]"),
    ({"key": torch.randn(1, 2, 5, 6)}, "key's head size 6 is not query's 4"),
    ({"value": torch.randn(1, 2, 6, 4)}, "value has 6 positions, but key has 5"),
    ({"query": torch.randn(4), "key": torch.randn(4), "value": torch.randn(4)}, "has 1 dims"),
    ({"attn_mask": torch.ones(3, 5, dtype=torch.bool), "is_causal": True}, "both a mask"),
    ({"attn_mask": torch.ones(3, 5, dtype=torch.int64)}, "attn_mask is torch.int64"),
    ({"attn_mask": torch.ones(4, 5, dtype=torch.bool)}, "does not broadcast"),
    ({"attn_mask": torch.ones(2, 2, 3, 5)}, "does not broadcast to the scores' shape"),
    ({"scale": float("nan")}, "scale is nan"),
    ({"out": torch.empty(1, 2, 3, 5)}, "out is torch.float32 [1, 2, 3, 5], but attention"),
    ({"out": torch.empty(1, 2, 3, 4, dtype=torch.float64)}, "out is torch.float64"),
])
def test_malformed_arguments_are_execution_errors(changes: dict[str, Any], words: str) -> None:
    arguments = _arguments(**changes)
    with pytest.raises(ExecutionError, match="exirc::attention") as raised:
        runtime_attention.attention_out(**arguments)
    assert words in str(raised.value)
    assert raised.value.code == "E0340"
    if "out" not in changes:
        assert (arguments["out"] == 7.0).all()  # refused before anything is written
