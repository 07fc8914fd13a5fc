"""Text generation over a loaded LLM program, as ExecuTorch's LLM runner drives one.

The program says what it is through its constant methods (`get_max_context_len`
or `get_max_seq_len`, `get_eos_ids`, `use_kv_cache`, `enable_dynamic_shape`):
the facts ExecuTorch's `TextLLMRunner` reads. Its `forward` takes the tokens
`[1, L]` and their positions (`[L]`, or the start position `[1]`) and returns
the logits `[1, L, vocab]`, keeping the KV cache as program state. A prompt is
fed whole when `forward` takes tokens of a dynamic length, else a token at a
time; then one token a call is generated, greedily or by sampling (temperature,
top-p), until an end-of-text token, the budget, or the end of the context.

Token ids in, token ids out: the tokenizer is the caller's (`exirc generate`
uses a HuggingFace `tokenizer.json`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from exirc.errors import UsageError

if TYPE_CHECKING:
    from exirc.runtime.core.loader import LoadedProgram
    from exirc.runtime.core.method import Method


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedily (temperature 0), else from the
    softmax of logits / temperature, cut to the smallest set of tokens whose
    probabilities reach `top_p`, drawn with a generator seeded by `seed`."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UsageError(f"temperature {self.temperature} and top-p {self.top_p}: the "
                             "temperature is 0 or more, top-p in (0, 1]")


@dataclass
class Generation:
    """What one generation did: the new tokens, why it stopped, and its times."""

    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    stopped: str = ""  # "end of text", "budget", "context"
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        decoded = max(len(self.tokens) - 1, 0)  # the first token comes from the prefill
        return decoded / self.decode_seconds if self.decode_seconds else 0.0


class TextGenerator:
    """Generates from `program`'s `forward` (see the module docstring)."""

    def __init__(self, program: LoadedProgram, method: str = "forward") -> None:
        facts = program.constant_methods
        if not facts.get("use_kv_cache", False):
            raise UsageError("the program does not say it keeps a KV cache (constant method "
                             "use_kv_cache): exirc generate drives LLM programs that do",
                             hint="compile a model file that declares ExecuTorch's LLM "
                                  "metadata in `constant_methods` (docs/llm.md)")
        context = facts.get("get_max_context_len", facts.get("get_max_seq_len"))
        if not isinstance(context, int) or context < 1:
            raise UsageError("the program does not say its context length (constant method "
                             "get_max_context_len or get_max_seq_len)", hint="see docs/llm.md")
        self.context = context
        eos = facts.get("get_eos_ids", [])
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.method: Method = program.method(method)
        if len(self.method.inputs) != 2:
            raise UsageError(f"method {method!r} takes {len(self.method.inputs)} inputs; an "
                             "LLM's forward takes the tokens and their positions")
        tokens_spec, self._positions_spec = self.method.inputs
        self._whole_prompt = bool(tokens_spec.dynamic)  # a prompt of any length at once
        self._program = program

    def generate(self, prompt: Sequence[int], max_new_tokens: int,
                 sampling: Sampling = Sampling(),
                 on_token: Callable[[int], None] | None = None) -> Generation:
        """Prefill `prompt`, then generate up to `max_new_tokens` (state starts afresh)."""
        if not prompt:
            raise UsageError("the prompt has no tokens")
        if len(prompt) >= self.context:
            raise UsageError(f"the prompt has {len(prompt)} tokens; the context holds "
                             f"{self.context}")
        self._program.reset_state()
        generator = torch.Generator().manual_seed(sampling.seed)
        done = Generation(prompt_tokens=len(prompt))
        started = time.perf_counter()
        logits = self._prefill(list(prompt))
        done.prefill_seconds = time.perf_counter() - started
        started = time.perf_counter()
        position = len(prompt)
        while True:
            token = _choose(logits, sampling, generator)
            done.tokens.append(token)
            if on_token is not None:
                on_token(token)
            if token in self.eos:
                done.stopped = "end of text"
                break
            if len(done.tokens) >= max_new_tokens:
                done.stopped = "budget"
                break
            if position >= self.context:
                done.stopped = "context"
                break
            logits = self._step([token], position)
            position += 1
        done.decode_seconds = time.perf_counter() - started
        return done

    def _prefill(self, prompt: list[int]) -> torch.Tensor:
        if self._whole_prompt:
            return self._step(prompt, 0)
        for position, token in enumerate(prompt):
            logits = self._step([token], position)
        return logits

    def _step(self, tokens: list[int], start: int) -> torch.Tensor:
        """The last position's logits after feeding `tokens` from position `start`."""
        count = len(tokens)
        positions = torch.arange(start, start + count) \
            if self._positions_spec.shape[0] != 1 or count == 1 else torch.tensor([start])
        logits = self.method.run([torch.tensor([tokens]), positions])[0]
        return logits.reshape(-1, logits.shape[-1])[-1].float()


def _choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    if sampling.temperature == 0:
        return int(logits.argmax())
    probabilities = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        ordered, order = probabilities.sort(descending=True)
        keep = ordered.cumsum(0) - ordered < sampling.top_p  # the top token always stays
        probabilities = torch.zeros_like(probabilities).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probabilities, 1, generator=generator))
