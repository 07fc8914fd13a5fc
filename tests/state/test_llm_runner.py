"""An LLM file ExecuTorch's LLM runner runs (issue 32): examples/tiny_llm.py, a
transformers LLaMA with its static cache and ExecuTorch's LLM metadata as
constant methods, compiled for XNNPACK. `TextLLMRunner(pte, tokenizer.json)`
(the runner behind ExecuTorch's Android and iOS apps) generates from it the
greedy tokens eager PyTorch does, and so does exirc's own runtime."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from exirc.compiler import CompileOptions, compile_model
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
