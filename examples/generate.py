"""Greedy generation with a compiled KV-cache decoder, from exirc's Python API.

    python examples/generate.py out/kv_decoder.pte

Loads the program compiled from `examples/kv_decoder.py`, runs `prefill` on
an 8-token prompt and then `forward` one token at a time, each call reading
the KV cache the calls before it wrote (program state). The same loop runs
on the eager model, and the two token sequences must be equal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_decoder import MAX_SEQ, PROMPT, VOCAB, model  # noqa: E402

from exirc.runtime import load  # noqa: E402

Step = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]


def generate(step: Step, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy decoding: `step(method, tokens, positions)` returns the logits."""
    logits = step("prefill", prompt[None, :], torch.arange(PROMPT))
    tokens = [int(logits[0, -1].argmax())]
    for position in range(PROMPT, PROMPT + new_tokens - 1):
        logits = step("forward", torch.tensor([[tokens[-1]]]), torch.tensor([position]))
        tokens.append(int(logits[0, -1].argmax()))
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", help="the .pte compiled from examples/kv_decoder.py")
    parser.add_argument("--new-tokens", type=int, default=MAX_SEQ - PROMPT)
    args = parser.parse_args()

    program = load(args.program)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1))
    compiled = generate(lambda method, *inputs: program.run(method, inputs)[0],
                        prompt, args.new_tokens)

    def eager(method: str, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(tokens, positions)

    expected = generate(eager, prompt, args.new_tokens)
    print(f"prompt:    {prompt.tolist()}")
    print(f"generated: {compiled}")
    if compiled != expected:
        print(f"eager:     {expected}\nthe compiled program generated other tokens than eager "
              "PyTorch", file=sys.stderr)
        return 1
    program.reset_state()  # the KV cache back to its initial value: a new conversation
    again = generate(lambda method, *inputs: program.run(method, inputs)[0],
                     prompt, args.new_tokens)
    print(f"the same {len(compiled)} tokens as eager PyTorch; after reset_state(), "
          f"{'the same again' if again == compiled else 'DIFFERENT'}")
    return 0 if again == compiled else 1


if __name__ == "__main__":
    sys.exit(main())
