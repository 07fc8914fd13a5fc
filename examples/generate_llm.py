"""Greedy generation from a compiled LLM with exirc's runtime, checked against eager.

    python examples/generate_llm.py out/tiny_llm.pte out/tokenizer.json "the model"

Loads the program compiled from `examples/tiny_llm.py` and reads what it needs
from its constant methods (as ExecuTorch's LLM runner does), feeds the prompt a
token at a time, then generates greedily until the end-of-text token or the
budget; the eager model generates the same way, and the tokens must be equal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_llm  # noqa: E402

from exirc.runtime import load  # noqa: E402


def generate(program_path: str, prompt: list[int], new_tokens: int) -> list[int]:
    program = load(program_path)
    facts = program.constant_methods
    eos = set(facts["get_eos_ids"])
    budget = min(new_tokens, facts["get_max_seq_len"] - len(prompt))
    forward = program.method("forward")

    def step(token: int, position: int) -> torch.Tensor:
        return forward.run([torch.tensor([[token]]), torch.tensor([position])])[0]

    for position, token in enumerate(prompt):
        logits = step(token, position)
    tokens: list[int] = []
    while len(tokens) < budget:
        tokens.append(int(logits[0, -1].argmax()))
        if tokens[-1] in eos:
            break
        logits = step(tokens[-1], len(prompt) + len(tokens) - 1)
    return tokens


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
