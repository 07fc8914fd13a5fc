"""An LLM file ExecuTorch's LLM runner runs (issue 32): examples/tiny_llm.py, a
transformers LLaMA with its static cache and ExecuTorch's LLM metadata as
constant methods, compiled for XNNPACK. `TextLLMRunner(pte, tokenizer.json)`
(the runner behind ExecuTorch's Android and iOS apps) generates from it the
greedy tokens eager PyTorch does, and so does exirc's own runtime."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exirc.compiler import CompileOptions, compile_model
from tests import warm_exirc
from tests.oracle import requires_executorch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROMPT, NEW_TOKENS = "the model", 20


@pytest.fixture(scope="module")
def example() -> Any:
    """examples/tiny_llm.py, its tokenizer module and its generation script."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import generate_llm
        import tiny_llm
        import tiny_llm_tokenizer
    finally:
        sys.path.remove(str(EXAMPLES))
    return tiny_llm, tiny_llm_tokenizer, generate_llm


@pytest.fixture(scope="module")
def files(example: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The program, compiled for XNNPACK, and the tokenizer.json."""
    _, tokenizer, _ = example
    folder = tmp_path_factory.mktemp("tiny_llm")
    program = folder / "tiny_llm.pte"
    compile_model(str(EXAMPLES / "tiny_llm.py"), CompileOptions(target="xnnpack")).save(program)
    tokenizer.train().save(str(folder / "tokenizer.json"))
    return program, folder / "tokenizer.json"


def _eager(example: Any, tokenizer_path: Path) -> tuple[Any, list[int]]:
    from tokenizers import Tokenizer

    tiny_llm, _, _ = example
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    return tokenizer, tiny_llm.eager_tokens(tokenizer.encode(PROMPT).ids, NEW_TOKENS)


def test_exirc_generates_the_eager_tokens(example: Any, files: tuple[Path, Path]) -> None:
    _, _, generate_llm = example
    tokenizer, expected = _eager(example, files[1])
    assert len(expected) >= 16 and len(set(expected)) > 4  # no early EOS, no one-token loop
    assert generate_llm.generate(str(files[0]), tokenizer.encode(PROMPT).ids,
                                 NEW_TOKENS) == expected


def test_the_prompt_is_prefilled_in_one_call_of_any_length(example: Any,
                                                            files: tuple[Path, Path]) -> None:
    """`enable_dynamic_shape`: the runner feeds the whole prompt to `forward`, whose
    length is dynamic up to the context, its linear layers delegated to XNNPACK."""
    from exirc.runtime import load
    from exirc.serialize.reader import deserialize

    tiny_llm, _, _ = example
    program = load(files[0])
    assert program.constant_methods["enable_dynamic_shape"] is True
    tokens, positions = program.method("forward").inputs
    assert tokens.dynamic and tokens.shape == (1, tiny_llm.MAX_SEQ)
    assert positions.symbol_dims == (tokens.symbol_dims[1],)  # one length for both
    (plan,) = [p for p in deserialize(str(files[0])).execution_plan if p.name == "forward"]
    assert plan.delegates and not {"aten::mm", "aten::linear", "aten::addmm"} & {
        op.name for op in plan.operators}


@requires_executorch
@pytest.mark.skipif(importlib.util.find_spec("executorch.extension.llm.runner") is None,
                    reason="needs ExecuTorch's LLM runner")
def test_executorch_llm_runner_generates_the_eager_tokens(example: Any,
                                                          files: tuple[Path, Path]) -> None:
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    tokenizer, expected = _eager(example, files[1])
    pieces: list[str] = []
    runner = TextLLMRunner(str(files[0]), str(files[1]))
    runner.generate(PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS, temperature=0.0,
                                             echo=False), token_callback=pieces.append)
    assert len(pieces) >= 16
    assert pieces == [tokenizer.decode([token]) for token in expected][:len(pieces)]


@requires_executorch
@pytest.mark.skipif(importlib.util.find_spec("executorch.extension.llm.runner") is None,
                    reason="needs ExecuTorch's LLM runner")
def test_external_weights_generate_the_eager_tokens_on_both_runners(
        example: Any, files: tuple[Path, Path], tmp_path: Path) -> None:
    """The same program with its weights in a .ptd: ExecuTorch's runner takes it as
    data_path, `exirc generate` as --data; both give the eager tokens."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    program, data = tmp_path / "llm.pte", tmp_path / "llm.ptd"
    options = CompileOptions(target="xnnpack", external_weights=data)
    compile_model(str(EXAMPLES / "tiny_llm.py"), options).save(program)
    assert data.stat().st_size > program.stat().st_size  # the weights left the program
    tokenizer, expected = _eager(example, files[1])
    pieces: list[str] = []
    runner = TextLLMRunner(str(program), str(files[1]), data_path=str(data))
    runner.generate(PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS, temperature=0.0,
                                             echo=False), token_callback=pieces.append)
    assert len(pieces) >= 16
    assert pieces == [tokenizer.decode([token]) for token in expected][:len(pieces)]
    done = _exirc_generate((program, files[1]), "--data", str(data),
                           "--max-new-tokens", str(NEW_TOKENS))
    assert done.returncode == 0, done.stderr
    assert done.stdout == tokenizer.decode(expected) + "\n"


def _exirc_generate(files: tuple[Path, Path], *options: str) -> subprocess.CompletedProcess[str]:
    return warm_exirc.exirc(["generate", str(files[0]), "--tokenizer", str(files[1]),
                             "--prompt", PROMPT, *options], text=True, timeout=300)


def test_exirc_generate_prints_the_eager_text_and_the_rates(example: Any,
                                                            files: tuple[Path, Path]) -> None:
    tokenizer, expected = _eager(example, files[1])
    done = _exirc_generate(files, "--max-new-tokens", str(NEW_TOKENS))
    assert done.returncode == 0, done.stderr
    assert done.stdout == tokenizer.decode(expected) + "\n"
    stats = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"prefill: {len(tokenizer.encode(PROMPT).ids)} tokens, [\d.]+ "
                        rf"tokens/s; decode: {NEW_TOKENS} tokens, [\d.]+ tokens/s; stopped at "
                        r"the budget", stats), stats


def test_sampling_is_seeded_and_not_greedy(example: Any, files: tuple[Path, Path]) -> None:
    from exirc.runtime import load
    from exirc.runtime.text_generation import Sampling, TextGenerator

    tokenizer, expected = _eager(example, files[1])
    generator = TextGenerator(load(files[0]))
    prompt = tokenizer.encode(PROMPT).ids
    sampled = [generator.generate(prompt, NEW_TOKENS, Sampling(1.5, 0.95, seed)).tokens
               for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]
    assert sampled[0] != expected
    assert generator.generate(prompt, NEW_TOKENS).tokens == expected  # state starts afresh


def test_a_program_that_is_no_llm_is_refused_with_the_reason(
        files: tuple[Path, Path], tmp_path: Path) -> None:
    import torch

    from exirc.compiler import compile_module

    mlp = tmp_path / "mlp.pte"
    compile_module(torch.nn.Linear(4, 4), (torch.randn(1, 4),)).save(mlp)
    done = _exirc_generate((mlp, files[1]))
    assert done.returncode == 2
    assert "error[E0200]: the program does not say it keeps a KV cache (constant method " \
           "use_kv_cache)" in done.stderr
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    done = _exirc_generate((files[0], bad))
    assert done.returncode == 2 and "cannot read it as a HuggingFace tokenizer.json" in \
        done.stderr and "Traceback" not in done.stderr


@requires_executorch
def test_the_llama_ops_file_generates_the_eager_tokens_on_both_runtimes(
        example: Any, files: tuple[Path, Path], tmp_path: Path) -> None:
    """--target xnnpack-llm: every attention bound to ExecuTorch's llama ops; exirc's
    runtime, ExecuTorch's (its LLM custom ops imported) and its LLM runner decode as
    eager does."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (its llama kernels)
    import torch
    from executorch.runtime import Runtime

    _, _, generate_llm = example
    tokenizer, expected = _eager(example, files[1])
    result = compile_model(str(EXAMPLES / "tiny_llm.py"), CompileOptions(target="xnnpack-llm"))
    operators = {op.qualified_name for op in result.program.execution_plan[0].operators}
    assert {"llama::update_cache.out", "llama::custom_sdpa.out"} <= operators
    assert not any(name.startswith("aten::index_put") for name in operators)
    program = tmp_path / "tiny_llm_llama_ops.pte"
    result.save(program)
    prompt = tokenizer.encode(PROMPT).ids
    assert generate_llm.generate(str(program), prompt, NEW_TOKENS) == expected

    method = Runtime.get().load_program(result.data).load_method("forward")

    def step(token: int, position: int) -> int:
        logits = method.execute([torch.tensor([[token]]), torch.tensor([position])])[0]
        return int(logits[0, -1].argmax())

    for position, token in enumerate(prompt):
        following = step(token, position)
    tokens = [following]
    while len(tokens) < len(expected):
        tokens.append(step(tokens[-1], len(prompt) + len(tokens) - 1))
    assert tokens == expected and len(tokens) >= 16
    if importlib.util.find_spec("executorch.extension.llm.runner") is not None:
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

        pieces: list[str] = []
        TextLLMRunner(str(program), str(files[1])).generate(
            PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS, temperature=0.0, echo=False),
            token_callback=pieces.append)
        assert pieces == [tokenizer.decode([token]) for token in expected][:len(pieces)]
        assert len(pieces) >= 16
