"""Every KV-cache pattern is program state (issue 32): persistent or not, on a
submodule or the root, written by any in-place form, shared by two methods.

A buffer registered with `persistent=False` (ExecuTorch's llama `KVCache`,
transformers' static-cache export wrapper) is in torch.export's `constants`,
not its `state_dict`; it used to be compiled as a constant that `copy_` wrote
into, a file exirc's loader refused and ExecuTorch's runtime crashed on.
Each case generates 16 greedy tokens on exirc's runtime and on ExecuTorch's,
equal to eager, for both targets.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.runtime import load
from tests.oracle import requires_executorch
from tests.state.cache_models import PROMPT, eager_tokens, generate, make_decoder

NEW_TOKENS = 16
PROMPT_TOKENS = [5, 17, 2, 33]

CASES = [  # (write form, persistent, caches on the root module)
    ("index_copy", False, False),
    ("index_copy", True, False),
    ("index_put", False, True),
    ("view_put", False, False),
    ("slice_shift", False, False),
    ("copy", False, True),
    ("copy", True, True),
    ("in_place", False, False),
]


def _compile(model: torch.nn.Module, target: str) -> CompileResult:
    decode = (torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    prefill = (torch.zeros(1, PROMPT, dtype=torch.int64), torch.arange(PROMPT))
    return compile_module(model, decode, methods={"prefill": (model, prefill)},
                          options=CompileOptions(target=target))


def _on_executorch(data: bytes) -> Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(data)
    methods = {name: program.load_method(name) for name in ("prefill", "forward")}

    def step(method: str, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # ExecuTorch's methods live only as long as their program: the closure keeps it.
        assert program is not None
        return methods[method].execute((tokens, positions))[0]
    return step


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
@pytest.mark.parametrize("form, persistent, on_root", CASES,
                         ids=[f"{f}-{'persistent' if p else 'non_persistent'}-"
                              f"{'root' if r else 'submodule'}" for f, p, r in CASES])
@requires_executorch
def test_the_cache_is_state_and_generates_the_eager_tokens(form: str, persistent: bool,
                                                           on_root: bool, target: str) -> None:
    model = make_decoder(form, persistent, on_root)
    expected = eager_tokens(model, PROMPT_TOKENS, NEW_TOKENS)
    result = _compile(model, target)
    cache_bytes = sum(b.numel() * b.element_size() for n, b in model.named_buffers()
                      if "cache" in n)
    assert result.report.state_bytes >= cache_bytes  # the caches, not constants
    program = load(result.data)
    assert program.has_state
    ours = generate(lambda m, *inputs: program.run(m, list(inputs))[0], PROMPT_TOKENS,
                    NEW_TOKENS)
    assert ours == expected
    assert generate(_on_executorch(result.data), PROMPT_TOKENS, NEW_TOKENS) == expected

    # The tokens depend on what earlier calls wrote: a cache emptied before
    # every call (a lost write) generates others.
    def forgetful(method: str, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        program.reset_state()
        return program.run(method, [tokens, positions])[0]

    assert generate(forgetful, PROMPT_TOKENS, NEW_TOKENS) != expected
