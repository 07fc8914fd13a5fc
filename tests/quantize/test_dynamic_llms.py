"""8da4w / 8da8w decoders on `--target xnnpack`: deployable, and as good as ExecuTorch's.

Two decoders with a static cache: examples/tiny_llm.py (LLaMA: RMSNorm, RoPE,
SiLU gates, grouped KV heads) and examples/tiny_gpt2.py (GPT-2: learned
positions, LayerNorm, GELU, a head tied to the embedding, and a `prefill`
method sharing the cache with `forward`). For each mode:

  - the file needs no kernels outside its XNNPACK delegates (`inspect`'s
    kernel line names no quantized library), and generates the quantized
    model's greedy tokens (`CompileResult.quantized_modules`, in eager) on
    exirc's runtime and on ExecuTorch's, in a process that never imports
    ExecuTorch's quantized kernel library;
  - its teacher-forced top-1 agreement with the float model is at least that
    of ExecuTorch's own scheme: the model quantized with torchao's `quantize_`
    (`Int8DynamicActivationIntxWeightConfig`, what ExecuTorch's 8da4w / 8da8w
    lowering starts from), lowered to the same XNNPACK nodes (ExecuTorch's own
    partitioner cannot lower transformers' static-cache wrapper: bench/llm.py),
    both files run on ExecuTorch's runtime.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from exirc.compiler import CompileOptions, CompileResult, compile_model, compile_module
from tests.executorch_without_quantized import generate_on_executorch_without_quantized_kernels
from tests.oracle import requires_executorch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DECODERS = {"llama": "tiny_llm.py", "gpt2": "tiny_gpt2.py"}
MODES = ("8da4w", "8da8w")
PROMPTS = ([1, 5, 9, 13], [1, 20, 40, 60], [1, 100, 7, 3], [1, 150, 151, 152])
NEW_TOKENS = 32
# A logit for the last position: (tokens, first position) -> [vocab].
Step = Callable[[list[int], int], torch.Tensor]

pytestmark = [requires_executorch, pytest.mark.oracle, pytest.mark.slow]


@functools.cache
def _example(name: str) -> ModuleType:
    path = EXAMPLES / DECODERS[name]
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _ours(name: str, mode: str) -> CompileResult:
    # The accuracy bar is this module's (teacher-forced agreement), not --min-sqnr's.
    return compile_model(str(EXAMPLES / DECODERS[name]),
                         CompileOptions(target="xnnpack", quantize=mode, min_sqnr_db=10.0))


def _last(out: Any) -> torch.Tensor:
    tensor = torch.as_tensor(out[0] if isinstance(out, (list, tuple)) else out)
    return tensor.reshape(-1, tensor.shape[-1])[-1].clone()


def _call(method: Callable[[list[Any]], Any]) -> Step:
    def step(tokens: list[int], start: int) -> torch.Tensor:
        positions = torch.arange(start, start + len(tokens))
        with torch.no_grad():
            return _last(method([torch.tensor([tokens]), positions]))
    return step


def _eager(module: torch.nn.Module) -> Step:
    return _call(lambda inputs: module(inputs[0], None, inputs[1]))


def _greedy(forward: Step, prompt: list[int], prefill: Step | None = None) -> list[int]:
    if prefill is not None:
        logits = prefill(prompt, 0)
    else:
        for position, token in enumerate(prompt):
            logits = forward([token], position)
    tokens: list[int] = []
    while len(tokens) < NEW_TOKENS:
        tokens.append(int(logits.argmax()))
        logits = forward([tokens[-1]], len(prompt) + len(tokens) - 1)
    return tokens


def _teacher_forced(forward: Step, texts: list[list[int]]) -> int:
    """How many of the float model's next tokens `forward` ranks first when fed the
    float model's own text, over every prompt (each step judged alone)."""
    agree = 0
    for prompt, text in zip(PROMPTS, texts):
        for position, token in enumerate(text[:-1]):
            logits = forward([token], position)
            agree += position >= len(prompt) - 1 and int(logits.argmax()) == text[position + 1]
    return agree


def _on_executorch(data: bytes) -> Step:
    from tests.oracle import executorch_method

    return _call(executorch_method(data))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_file_needs_no_quantized_kernels_and_generates_the_quantized_models_tokens(
        name: str, mode: str, tmp_path: Path) -> None:
    from exirc.inspector.kernels import kernel_needs, kernels_line
    from exirc.runtime import load
    from exirc.serialize.reader import deserialize

    result = _ours(name, mode)
    needs = kernel_needs(deserialize(result.data))
    assert [library["name"] for library in needs["libraries"]] == ["portable"]
    assert "quantized" not in kernels_line(needs) and needs["delegates"] == ["XnnpackBackend"]

    two_methods = "prefill" in result.quantized_modules
    eager = {m: _eager(module) for m, module in result.quantized_modules.items()}
    program = load(result.data)  # the engine `exirc run` picks
    ours = {m: _call(lambda inputs, m=m: program.run(m, inputs))
            for m in result.quantized_modules}
    prompts = list(PROMPTS[:2])
    expected = [_greedy(eager["forward"], p, eager.get("prefill")) for p in prompts]
    assert [_greedy(ours["forward"], p, ours.get("prefill")) for p in prompts] == expected
    assert generate_on_executorch_without_quantized_kernels(
        result.data, prompts, NEW_TOKENS, tmp_path,
        prefill="prefill" if two_methods else None) == expected


def _executorchs_scheme(name: str, mode: str) -> bytes:
    """The decoder quantized as ExecuTorch's 8da lowering quantizes it (torchao's
    `quantize_`), lowered by exirc to the XNNPACK nodes ExecuTorch writes for it."""
    import copy

    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    example = _example(name)
    model = copy.deepcopy(example.model)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(32)) if mode == "8da4w" else
        Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8,
                                              weight_granularity=PerAxis(0)))
    inputs = example.example_inputs
    return compile_module(model, (inputs["input_ids"], None, inputs["cache_position"]),
                          dynamic_shapes=getattr(example, "dynamic_shapes", None),
                          options=CompileOptions(target="xnnpack")).data


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(DECODERS))
def test_teacher_forced_agreement_with_float_is_at_least_executorchs(name: str,
                                                                      mode: str) -> None:
    example = _example(name)
    float_step = _eager(example.model)
    texts = [prompt + _greedy(float_step, prompt) for prompt in PROMPTS]
    ours = _teacher_forced(_on_executorch(_ours(name, mode).data), texts)
    theirs = _teacher_forced(_on_executorch(_executorchs_scheme(name, mode)), texts)
    positions = len(PROMPTS) * NEW_TOKENS
    assert theirs > positions // 2  # a scheme that works, so the comparison means something
    assert ours >= theirs, f"{name} {mode}: {ours}/{positions} against ExecuTorch's {theirs}"
