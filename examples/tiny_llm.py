"""A tiny LLaMA with a static KV cache, as ExecuTorch's LLM runner runs it.

    exirc compile examples/tiny_llm.py --target xnnpack -o out/tiny_llm.pte
    python examples/tiny_llm_tokenizer.py out/tokenizer.json
    python examples/generate_llm.py out/tiny_llm.pte out/tokenizer.json "the model"

A transformers `LlamaForCausalLM` built from a small config with random
weights (nothing is downloaded), wrapped in transformers' own export wrapper
with its static cache (`TorchExportableModuleWithStaticCache`: the caches are
buffers the method writes, so exirc makes them program state).
`forward(input_ids [1, n], cache_position [n]) -> logits [1, n, VOCAB]` takes any
n from 1 to MAX_SEQ (a dynamic length, delegated to XNNPACK within its bound): the
whole prompt in one call, then one token a call.

`constant_methods` are the facts ExecuTorch's LLM runner reads from the file
(`executorch.extension.llm.runner.TextLLMRunner(pte, tokenizer.json)`): the
context length, the vocabulary, that the model keeps a KV cache and takes a
prompt of many tokens in one call (`enable_dynamic_shape`), and its special tokens.
"""

import sys
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_llm_tokenizer import BOS_ID, EOS_ID, VOCAB  # noqa: E402

MAX_SEQ, LAYERS = 64, 2

config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=MAX_SEQ, bos_token_id=BOS_ID,
                     eos_token_id=EOS_ID)
torch.manual_seed(9)  # random weights whose greedy text runs 20 tokens and more before EOS
llama = LlamaForCausalLM(config).eval()
llama.generation_config = GenerationConfig(
    use_cache=True, cache_implementation="static", max_length=MAX_SEQ,
    cache_config={"batch_size": 1, "max_cache_len": MAX_SEQ})
model = TorchExportableModuleWithStaticCache(llama, batch_size=1, max_cache_len=MAX_SEQ).eval()
example_inputs = {"input_ids": torch.zeros(1, 2, dtype=torch.long),
                  "cache_position": torch.tensor([0, 1])}
_seq = torch.export.Dim("seq", min=1, max=MAX_SEQ)
dynamic_shapes = {"input_ids": {1: _seq}, "inputs_embeds": None, "cache_position": {0: _seq}}

constant_methods = {
    "get_max_seq_len": MAX_SEQ, "get_max_context_len": MAX_SEQ, "get_vocab_size": VOCAB,
    "get_n_layers": LAYERS, "use_kv_cache": True, "use_sdpa_with_kv_cache": False,
    "enable_dynamic_shape": True, "get_bos_id": BOS_ID, "get_eos_ids": [EOS_ID],
}


def eager_tokens(prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding on the eager model as the runner calls the program (the
    prompt in one call, then a token a call), until EOS or `new_tokens`; the cache
    is put back."""
    saved = {name: buffer.clone() for name, buffer in model.named_buffers()}

    def step(tokens: list[int], start: int) -> torch.Tensor:
        return model(input_ids=torch.tensor([tokens]),
                     cache_position=torch.arange(start, start + len(tokens)))

    tokens: list[int] = []
    try:
        with torch.no_grad():
            logits = step(prompt, 0)
            while len(tokens) < new_tokens:
                tokens.append(int(logits[0, -1].argmax()))
                if tokens[-1] == EOS_ID:
                    break
                logits = step(tokens[-1:], len(prompt) + len(tokens) - 1)
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(saved[name])
    return tokens
