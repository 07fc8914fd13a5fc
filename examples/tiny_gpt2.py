"""A tiny GPT-2 with a static KV cache and two methods sharing it.

    exirc compile examples/tiny_gpt2.py --target xnnpack --quantize 8da4w -o out/tiny_gpt2.pte

A transformers `GPT2LMHeadModel` built from a small config with random weights
(nothing is downloaded): learned positional embeddings, LayerNorm, tanh GELU,
and an LM head tied to the token embedding. It is wrapped, as
examples/tiny_llm.py wraps its LLaMA, in transformers' export wrapper with its
static cache (`TorchExportableModuleWithStaticCache`), whose caches exirc makes
program state that both methods read and write:

    prefill(input_ids [1, PROMPT], cache_position [PROMPT])  the prompt at once
    forward(input_ids [1, 1], cache_position [1])            one token a call
"""

import sys
from pathlib import Path

import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_llm_tokenizer import BOS_ID, EOS_ID, VOCAB  # noqa: E402

MAX_SEQ, LAYERS, PROMPT = 64, 2, 4

config = GPT2Config(vocab_size=VOCAB, n_positions=MAX_SEQ, n_embd=64, n_layer=LAYERS, n_head=4,
                    bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=True)
torch.manual_seed(9)
gpt2 = GPT2LMHeadModel(config).eval()
gpt2.generation_config = GenerationConfig(
    use_cache=True, cache_implementation="static", max_length=MAX_SEQ,
    cache_config={"batch_size": 1, "max_cache_len": MAX_SEQ})
model = TorchExportableModuleWithStaticCache(gpt2, batch_size=1, max_cache_len=MAX_SEQ).eval()
example_inputs = {"input_ids": torch.zeros(1, 1, dtype=torch.long),
                  "cache_position": torch.tensor([0])}
methods = {"prefill": (model, {"input_ids": torch.zeros(1, PROMPT, dtype=torch.long),
                               "cache_position": torch.arange(PROMPT)})}
