"""Greedy generation from a compiled LLM with exirc's runtime, checked against eager.

    python examples/generate_llm.py out/tiny_llm.pte out/tokenizer.json "the model"

Loads the program compiled from `examples/tiny_llm.py` and generates greedily
with `exirc.runtime.text_generation` (what `exirc generate` runs: it reads the
program's constant methods as ExecuTorch's LLM runner does, feeds the prompt,
then decodes until the end-of-text token or the budget); the eager model
generates the same way, and the tokens must be equal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_llm  # noqa: E402

from exirc.runtime import load  # noqa: E402
from exirc.runtime.text_generation import TextGenerator  # noqa: E402


def generate(program_path: str, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens from the compiled program, driven as `exirc generate` drives it."""
    return TextGenerator(load(program_path)).generate(prompt, new_tokens).tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program")
    parser.add_argument("tokenizer")
    parser.add_argument("prompt")
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(args.tokenizer)
    prompt = tokenizer.encode(args.prompt).ids
    compiled = generate(args.program, prompt, args.new_tokens)
    expected = tiny_llm.eager_tokens(prompt, args.new_tokens)
    print(f"prompt:    {args.prompt!r} {prompt}")
    print(f"generated: {tokenizer.decode(compiled)!r} {compiled}")
    if compiled != expected:
        print(f"eager:     {expected}\nthe compiled program generated other tokens than eager "
              "PyTorch", file=sys.stderr)
        return 1
    print("the same tokens as eager PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
