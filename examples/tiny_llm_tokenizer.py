"""The tokenizer of `tiny_llm.py`: a byte-level BPE trained here, on the text below.

    python examples/tiny_llm_tokenizer.py out/tokenizer.json

Nothing is downloaded: the `tokenizers` package trains it in a fraction of a
second, the same way every time. Its vocabulary has exactly `VOCAB` entries,
the model's vocabulary size (ExecuTorch's LLM runner samples among the
tokenizer's tokens, so the two must agree). The corpus is ASCII, so every
token decodes to whole characters.
"""

from __future__ import annotations

import sys
from typing import Any

VOCAB = 192
SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1 (beginning of text), 2 (end of text)
BOS_ID, EOS_ID = 1, 2

CORPUS = """
exirc turns a PyTorch model into a program file and runs it. The compiler
captures the model with torch export, lowers it through the edge dialect to
the backend dialect, plans its memory and writes a flatbuffer program. The
runtime loads the program, checks every instruction and runs the kernels.
A language model keeps the keys and values of the tokens it has seen in a
cache; each call writes the new ones and reads them all. The prompt is read
first, then one token at a time is generated until the end of the text.
""" * 8


def train() -> Any:
    """The tokenizer (a `tokenizers.Tokenizer`) with exactly VOCAB tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS.split("\n"), trainer)
    if tokenizer.get_vocab_size() != VOCAB:
        raise RuntimeError(f"the corpus gave {tokenizer.get_vocab_size()} tokens, not {VOCAB}")
    return tokenizer


if __name__ == "__main__":
    train().save(sys.argv[1] if len(sys.argv) > 1 else "tokenizer.json")
