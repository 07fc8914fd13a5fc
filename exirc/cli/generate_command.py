"""`exirc generate`: text from an LLM program and a tokenizer, as ExecuTorch's runner.

A thin layer over `exirc.runtime.text_generation`: it reads the tokenizer,
encodes the prompt, generates, prints the text as it comes, then the figures
ExecuTorch's LLM runner prints (tokens and tokens/s of the prefill and of the
decode).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from exirc.cli.run_timing import threads_option, torch_threads
from exirc.errors import UsageError
from exirc.runtime.engines.policy import ENGINES as ENGINE_NAMES

EPILOG = """\b
Examples:
  exirc generate tiny_llm.pte --tokenizer tokenizer.json --prompt "the model"
  exirc generate tiny_llm.pte --tokenizer tokenizer.json --prompt "the model" \\
      --max-new-tokens 64 --temperature 0.8 --top-p 0.9 --seed 3
  exirc generate llm.pte --data llm.ptd --tokenizer tokenizer.json --prompt "the model"

The program is one compiled with ExecuTorch's LLM metadata as constant
methods (docs/llm.md); the tokenizer a HuggingFace tokenizer.json (the
`tokenizers` package reads it). Greedy unless --temperature is above 0.
"""


@click.command("generate", epilog=EPILOG)
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--tokenizer", "tokenizer_path", required=True, metavar="FILE",
              type=click.Path(dir_okay=False, path_type=str),
              help="The model's HuggingFace tokenizer.json.")
@click.option("--data", "data_path", default=None, metavar="FILE.ptd",
              type=click.Path(dir_okay=False, path_type=str),
              help="The program's external data file, for weights compiled with "
                   "--external-weights (ExecuTorch's runner: data_path).")
@click.option("--prompt", required=True, help="The text to continue.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0: greedy; above: sample from softmax(logits / temperature).")
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0,
              show_default=True, help="Sample among the most likely tokens whose "
                                      "probabilities add up to this.")
@click.option("--seed", type=int, default=0, show_default=True, help="The sampling's seed.")
@click.option("--engine", type=click.Choice(ENGINE_NAMES), default=None,
              help="What runs the program (as `exirc run --engine`).")
@click.option("--threads", type=int, default=None, callback=threads_option, metavar="N",
              help="torch's intra-op threads (default 1).")
def generate_command(path: str, tokenizer_path: str, data_path: str | None, prompt: str,
                     max_new_tokens: int,
                     temperature: float, top_p: float, seed: int, engine: str | None,
                     threads: int) -> None:
    """Generate text from the LLM program PATH, prompted with --prompt."""
    from exirc.runtime import load
    from exirc.runtime.text_generation import Sampling, TextGenerator

    tokenizer = _tokenizer(tokenizer_path)
    ids = tokenizer.encode(prompt).ids
    with torch_threads(threads):
        generator = TextGenerator(load(path, data=data_path, engine=engine))
        shown: list[int] = []

        def show(token: int) -> None:
            # Decoded as a whole so far: a token may be half a character.
            before = tokenizer.decode(shown)
            shown.append(token)
            sys.stdout.write(tokenizer.decode(shown)[len(before):])
            sys.stdout.flush()

        done = generator.generate(ids, max_new_tokens, Sampling(temperature, top_p, seed), show)
    sys.stdout.write("\n")
    click.echo(f"prefill: {done.prompt_tokens} tokens, "
               f"{done.prefill_tokens_per_second:.1f} tokens/s; decode: {len(done.tokens)} "
               f"tokens, {done.decode_tokens_per_second:.1f} tokens/s; stopped at the "
               f"{done.stopped}", err=True)


def _tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise UsageError("exirc generate reads tokenizer.json with the `tokenizers` package, "
                         "which is not installed", hint="pip install tokenizers") from error
    try:
        return Tokenizer.from_file(path)
    except Exception as error:  # noqa: BLE001 (the library's own message says what is wrong)
        raise UsageError(f"{path}: cannot read it as a HuggingFace tokenizer.json: "
                         f"{(str(error).splitlines() or [''])[0]}",
                         hint="give the tokenizer.json the model was trained with") from error
