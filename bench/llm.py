"""The LLM section (issue 32): decode and prefill tokens/s of a small decoder.

The model is examples/tiny_llm.py (a LLaMA of 2 layers, width 64, 4 heads over
2 key/value heads, a vocabulary of 192, a static cache of 64 positions, wrapped
in transformers' `TorchExportableModuleWithStaticCache`). Programs, each run on
ExecuTorch's runtime (1 thread; its XNNPACK delegates use its threadpool):

- `exirc xnnpack`: `exirc compile examples/tiny_llm.py --target xnnpack`;
- `exirc xnnpack-llm`: the same with `--target xnnpack-llm`, its attention bound
  to ExecuTorch's `llama::update_cache` and `llama::custom_sdpa` (imported from
  `executorch.extension.llm.custom_ops` in this process, as export_llm's are);
- `executorch xnnpack`: ExecuTorch's own lowering of the same wrapper
  (`to_edge_transform_and_lower` with its XNNPACK partitioner). With the
  transformers of this environment it fails inside torch's decomposition (the
  static cache's tensors are lifted constants the method writes, which
  `run_decompositions` cannot take); the row then gives the reason;
- `export_llm`: ExecuTorch's LLM export (its own llama model of the same
  dimensions from a params.json with random weights, `use_kv_cache`,
  `use_sdpa_with_kv_cache`, XNNPACK): ExecuTorch's best for such a model. It
  needs `hydra-core`, `omegaconf`, `pandas` and `pytorch-tokenizers` (the
  `bench` extra); without them the row says so.

and exirc's file on exirc's own runtime (`auto`: the engine `exirc run` picks).
Quantized (issue 33): exirc's `--quantize 8da4w` and `8da8w` files of tiny_llm,
for `xnnpack` and `xnnpack-llm`, next to export_llm's `qmode=8da4w` (groups of 32); ExecuTorch's own
8da4w lowering of the wrapper fails where its float lowering does.

Decode: one token a call at positions 16..47 (the cache content does not change
the work of a static-cache program; export_llm's attention reads positions up
to the current one only). Prefill: a 16-token prompt in one call (tiny_llm's
forward takes any length up to its context, delegated to XNNPACK within that
bound, as export_llm's does). Timed in interleaved rounds (bench/interleave.py),
each runtime's files among themselves, medians. Each file of tiny_llm is checked
against the float model in eager: `greedy_vs_eager`, how many of its 16 greedy
tokens after the prompt equal eager's before the first miss; `top1_vs_eager`,
how many of eager's next tokens it ranks first when fed eager's text
(teacher-forced). export_llm's model has other weights: not compared.
`decode_vs_export_llm` is the decode speed over export_llm's (the float one for
float files, its 8da4w for quantized ones; above 1: faster); the goal is 1 or more.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
for folder in (ROOT, EXAMPLES):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench.common import Row  # noqa: E402
from bench.engines import HAVE_EXECUTORCH, first_line, use_threads  # noqa: E402
from bench.interleave import interleaved_medians  # noqa: E402

PROMPT = 16  # prompt tokens, and the first decoded position
DECODE = 32  # decoded positions per timed call
CHECKED_TOKENS = 16
BUDGET_SECONDS = 8.0  # per interleaved measurement (decode, prefill)
QUANTIZED = ("8da4w", "8da8w")

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (tokens, positions) -> logits


def _tiny_llm() -> Any:
    return importlib.import_module("tiny_llm")


def _exirc_file(target: str, quantize: str | None = None) -> bytes:
    from exirc.compiler import CompileOptions, compile_model

    options = CompileOptions(target=target, quantize=quantize)
    return bytes(compile_model(str(EXAMPLES / "tiny_llm.py"), options, warn=lambda _: None).data)


def _executorch_lowering(model: torch.nn.Module, example: dict[str, torch.Tensor],
                         dynamic_shapes: Any) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    shapes = {k: v for k, v in dynamic_shapes.items() if k in example}  # the kwargs given
    exported = torch.export.export(model, (), kwargs=example, dynamic_shapes=shapes,
                                   strict=False)
    return bytes(to_edge_transform_and_lower(
        exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)


def _export_llm_file(tiny: Any, folder: Path, quantize: str | None) -> bytes:
    """ExecuTorch's export_llm output for a llama of tiny_llm's dimensions, float or
    with its `qmode` (8da4w: groups of 32, as exirc's default)."""
    from executorch.examples.models.llama.export_llama_lib import export_llama
    from executorch.extension.llm.export.config.llm_config import LlmConfig, ModelType

    config = tiny.config
    params = {"dim": config.hidden_size, "n_layers": config.num_hidden_layers,
              "n_heads": config.num_attention_heads, "n_kv_heads": config.num_key_value_heads,
              "vocab_size": config.vocab_size, "hidden_dim": config.intermediate_size,
              "norm_eps": config.rms_norm_eps, "rope_theta": 10000.0, "use_scaled_rope": False}
    (folder / "params.json").write_text(json.dumps(params))
    llm = LlmConfig()
    llm.base.model_class = ModelType.llama3
    llm.base.params = str(folder / "params.json")
    llm.model.use_kv_cache = True
    llm.model.use_sdpa_with_kv_cache = True
    llm.backend.xnnpack.enabled = True
    if quantize is not None:
        llm.quantization.qmode = quantize
        llm.quantization.group_size = 32
    llm.export.max_seq_length = tiny.MAX_SEQ
    llm.export.max_context_length = tiny.MAX_SEQ
    llm.export.output_dir = str(folder)
    llm.export.output_name = str(folder / "export_llm.pte")  # a .pte name is the path as is
    export_llama(llm)
    return (folder / "export_llm.pte").read_bytes()


def _on_executorch(pte: bytes) -> Step:
    from executorch.extension.pybindings import portable_lib

    loaded = portable_lib._load_for_executorch_from_buffer(pte)
    return lambda tokens, positions: loaded.forward([tokens, positions])[0]


def _on_exirc(pte: bytes) -> Step:
    from exirc.runtime import load

    method = load(pte).method("forward")
    return lambda tokens, positions: method.run([tokens, positions])[0]


def _whole_prompt(step: Step, positions: torch.Tensor
                  ) -> tuple[Callable[[], None], Callable[[], None]]:
    """Decode and prefill runners for a forward that takes a prompt at once, at
    `positions` (the wrapper's cache positions; export_llm's start position)."""
    def decode() -> None:
        for position in range(PROMPT, PROMPT + DECODE):
            step(torch.tensor([[5]]), torch.tensor([position]))

    prompt = torch.arange(3, 3 + PROMPT).reshape(1, PROMPT)

    def prefill() -> None:
        step(prompt, positions)

    return decode, prefill


def _greedy(step: Step, prompt: list[int], count: int) -> list[int]:
    """As tiny_llm's `eager_tokens`: the prompt in one call, then a token a call."""
    logits = step(torch.tensor([prompt]), torch.arange(len(prompt)))
    tokens: list[int] = []
    while len(tokens) < count:
        tokens.append(int(logits[0, -1].argmax()))
        logits = step(torch.tensor([[tokens[-1]]]), torch.tensor([len(prompt) + len(tokens) - 1]))
    return tokens


def _teacher_forced(step: Step, prompt: list[int], continuation: list[int]) -> int:
    """How many of the float model's next tokens the program also ranks first when fed
    the float model's own text (each step judged alone, unlike free-running greedy)."""
    text = prompt + continuation
    agree = 0
    for position, token in enumerate(text[:-1]):
        logits = step(torch.tensor([[token]]), torch.tensor([position]))
        if position >= len(prompt) - 1:
            agree += int(logits[0, -1].argmax()) == text[position + 1]
    return agree


def _agreement(got: list[int], want: list[int]) -> int:
    """How many leading tokens equal eager's (free-running: the first miss ends it)."""
    for count, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return count
    return min(len(got), len(want))


def _programs(tiny: Any) -> tuple[dict[str, tuple[bytes, Step, bool]], dict[str, str]]:
    """name -> (file, step, whether it is tiny_llm's own model); and rows left out, why."""
    programs: dict[str, tuple[bytes, Step, bool]] = {}
    notes: dict[str, str] = {}
    ours = _exirc_file("xnnpack")
    programs["exirc xnnpack / executorch"] = (ours, _on_executorch(ours), True)
    programs["exirc xnnpack / exirc"] = (ours, _on_exirc(ours), True)
    with_ops = _exirc_file("xnnpack-llm")  # attention as ExecuTorch's llama ops
    programs["exirc xnnpack-llm / executorch"] = (with_ops, _on_executorch(with_ops), True)
    programs["exirc xnnpack-llm / exirc"] = (with_ops, _on_exirc(with_ops), True)
    for mode in QUANTIZED:
        for target in ("xnnpack", "xnnpack-llm"):
            pte = _exirc_file(target, mode)
            programs[f"exirc {mode} {target} / executorch"] = (pte, _on_executorch(pte), True)
    try:
        theirs = _executorch_lowering(tiny.model, tiny.example_inputs, tiny.dynamic_shapes)
        programs["executorch xnnpack / executorch"] = (theirs, _on_executorch(theirs), True)
    except Exception as error:  # its lowering raises many kinds; the row says which
        notes["executorch xnnpack / executorch"] = first_line(error)
    for mode in (None, "8da4w"):
        name = "export_llm" + (f" {mode}" if mode else "") + " / executorch"
        try:
            with tempfile.TemporaryDirectory() as folder:
                pte = _export_llm_file(tiny, Path(folder), mode)
            programs[name] = (pte, _on_executorch(pte), False)
        except ImportError as error:
            notes[name] = f"needs {error.name} (pip install -e '.[bench]')"
    return programs, notes


def run() -> list[Row]:
    if not HAVE_EXECUTORCH:
        return [{"program / runtime": "-", "notes": "ExecuTorch is not installed"}]
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama:: kernels)

    use_threads(1)  # before any program loads: resetting the threadpool under a loaded
    # XNNPACK delegate is what `_unsafe_reset_threadpool` warns of (it crashed here)
    tiny = _tiny_llm()
    prompt = list(range(3, 3 + PROMPT))
    eager = tiny.eager_tokens(prompt, CHECKED_TOKENS)  # fewer if it ends at EOS
    programs, notes = _programs(tiny)
    checks = {name: (_agreement(_greedy(step, prompt, CHECKED_TOKENS), eager),
                     _teacher_forced(step, prompt, eager))
              for name, (_, step, same) in programs.items() if same}
    runners = {name: _whole_prompt(step, torch.arange(PROMPT) if same else torch.tensor([0]))
               for name, (_, step, same) in programs.items()}
    decode: dict[str, float] = {}
    prefill: dict[str, float] = {}
    # Each runtime's files interleaved among themselves: a sample of exirc's
    # Python interpreter between two of ExecuTorch's evicts what their next
    # call would find in cache, and the rows compared (ours against export_llm)
    # are all on ExecuTorch's runtime.
    for runtime in ("/ executorch", "/ exirc"):
        group = {n: r for n, r in runners.items() if n.endswith(runtime)}
        with torch.no_grad():
            decode |= interleaved_medians({n: r[0] for n, r in group.items()}, BUDGET_SECONDS,
                                          min_rounds=3)
            prefill |= interleaved_medians({n: r[1] for n, r in group.items()},
                                           BUDGET_SECONDS, min_rounds=3)
    rows: list[Row] = []
    for name, (pte, _, same) in programs.items():
        decode_rate = DECODE / decode[name]
        quantized = next((m for m in QUANTIZED if m in name), None)
        reference = decode.get("export_llm 8da4w / executorch" if quantized
                               else "export_llm / executorch")
        rows.append({
            "program / runtime": name, "threads": 1,
            "decode_tok_s": decode_rate, "prefill_tok_s": PROMPT / prefill[name],
            "size_kb": len(pte) / 1024,
            "greedy_vs_eager": f"{checks[name][0]}/{len(eager)}" if same else "-",
            "top1_vs_eager": f"{checks[name][1]}/{len(eager)}" if same else "-",
            "decode_vs_export_llm": decode_rate * reference / DECODE if reference else None,
        })
    rows += [{"program / runtime": name, "threads": 1, "notes": why} for name, why in notes.items()]
    return rows
