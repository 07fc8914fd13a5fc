"""transformers' own static-cache export wrapper compiles and generates like eager.

`TorchExportableModuleWithStaticCache` registers its caches as non-persistent
buffers but reads and writes them through the `StaticCache` object, so
torch.export lifts them as tensor constants that the method writes in place;
torch's decomposition then fails (and ExecuTorch's `to_edge` with it). exirc
makes such written constants state (`exirc.ir.state.adopt_written_constants`).
When torch itself fails to decompose a program, the error says so.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from exirc.edge.to_edge import ToEdge, TorchDecompositionError
from exirc.runtime import load
from tests.oracle import requires_executorch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:A model attribute:UserWarning")

MAX_CACHE, PROMPT, NEW_TOKENS = 32, 4, 16
PROMPT_TOKENS = [3, 41, 7, 20]


def _decoder(arch: str) -> torch.nn.Module:
    """A tiny random-weight decoder wrapped with its static cache."""
    from transformers import GenerationConfig, LlamaConfig, Qwen2Config
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    shared = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    config = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch](**shared)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", max_length=MAX_CACHE,
        cache_config={"batch_size": 1, "max_cache_len": MAX_CACHE})
    return TorchExportableModuleWithStaticCache(model, batch_size=1,
                                                max_cache_len=MAX_CACHE).eval()


def _inputs(tokens: list[int], start: int) -> tuple[Any, ...]:
    """(input_ids, inputs_embeds, cache_position), as the wrapper's forward takes them."""
    return (torch.tensor([tokens]), None, torch.arange(start, start + len(tokens)))


def _generate(step: Any) -> list[int]:
    """`prefill` the prompt, then `forward` one token at a time; greedy."""
    logits = step("prefill", _inputs(PROMPT_TOKENS, 0))
    tokens = [int(logits[0, -1].argmax())]
    for position in range(PROMPT, PROMPT + NEW_TOKENS - 1):
        logits = step("forward", _inputs(tokens[-1:], position))
        tokens.append(int(logits[0, -1].argmax()))
    return tokens


def _eager(model: torch.nn.Module) -> list[int]:
    saved = {name: buffer.clone() for name, buffer in model.named_buffers()}
    try:
        with torch.no_grad():
            return _generate(lambda method, inputs: model(*inputs))
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(saved[name])


@requires_executorch
@pytest.mark.parametrize("target", ["portable", "xnnpack", "xnnpack-llm"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_static_cache_generates_the_eager_tokens(arch: str, target: str) -> None:
    from executorch.runtime import Runtime

    if target == "xnnpack-llm":  # registers ExecuTorch's llama ops in its runtime
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    model = _decoder(arch)
    expected = _eager(model)
    result = compile_module(model, _inputs([0], 0),
                            methods={"prefill": (model, _inputs([0] * PROMPT, 0))},
                            options=CompileOptions(target=target))
    assert result.report.state_bytes > 0
    program = load(result.data)
    # The wrapper's forward takes no inputs_embeds: the compiled methods have two inputs.
    assert _generate(lambda m, inputs: program.run(m, [inputs[0], inputs[2]])[0]) == expected

    loaded = Runtime.get().load_program(result.data)
    methods = {name: loaded.load_method(name) for name in ("prefill", "forward")}
    assert _generate(lambda m, inputs: methods[m].execute((inputs[0], inputs[2]))[0]) \
        == expected


BOUND = 8


@requires_executorch
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_a_dynamic_prefill_of_the_static_cache_generates_the_eager_tokens(target: str) -> None:
    """One method, its length dynamic (1..BOUND): each prompt length prefilled in
    one call, then 3 tokens decoded, one after another on one cache, as eager."""
    from executorch.runtime import Runtime

    model = _decoder("llama")
    seq = torch.export.Dim("seq", min=1, max=BOUND)
    result = compile_module(model, _inputs([0] * 3, 0),
                            dynamic_shapes={"input_ids": {1: seq}, "inputs_embeds": None,
                                            "cache_position": {0: seq}},
                            options=CompileOptions(target=target))
    if target == "xnnpack":
        assert not {"addmm", "mm", "bmm"} & {e.op for e in result.delegation["forward"].left_out}

    def session(step: Any) -> list[int]:
        tokens: list[int] = []
        for length in range(1, BOUND + 1):
            prompt = [(5 * i + length) % 64 for i in range(length)]
            logits = step(_inputs(prompt, 0))
            tokens.append(int(logits[0, -1].argmax()))
            for position in range(length, length + 3):
                tokens.append(int(step(_inputs(tokens[-1:], position))[0, -1].argmax()))
        return tokens

    saved = {name: buffer.clone() for name, buffer in model.named_buffers()}
    with torch.no_grad():
        expected = session(lambda inputs: model(*inputs))
        for name, buffer in model.named_buffers():
            buffer.copy_(saved[name])
    ours = load(result.data)
    assert session(lambda inputs: ours.run("forward", [inputs[0], inputs[2]])[0]) == expected
    program = Runtime.get().load_program(result.data)  # alive while its method runs
    method = program.load_method("forward")
    assert session(lambda inputs: method.execute((inputs[0], inputs[2]))[0]) == expected


def test_a_decomposition_torch_fails_is_blamed_on_torch_with_a_way_forward() -> None:
    """The raw export (its caches still written constants) fails inside torch."""
    model = _decoder("llama")
    exported = torch.export.export(model, (), {"input_ids": torch.tensor([[1]]),
                                               "cache_position": torch.tensor([0])},
                                   strict=False)
    with pytest.raises(TorchDecompositionError) as raised:
        ToEdge().run(exported)
    message, hint = raised.value.message, raised.value.hint or ""
    assert "inside torch" in message and "run_decompositions" in message
    assert "AssertionError" in message  # torch's own exception, named
    assert "register_buffer" in hint and "--debug" in hint
