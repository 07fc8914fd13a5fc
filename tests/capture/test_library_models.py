"""Models from libraries, as users bring them: a .pt2 whose outputs are a
library's types (`compile --import`), a transformers model that returns its
cache, a keyword input export specialised on; errors never cut mid-word."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exirc.capture.messages import shorten
from tests import warm_exirc

# A module defining an output type, registered with pytree under its module's
# name, as transformers registers its ModelOutput classes.
OUTPUT_TYPES = """\
import dataclasses

import torch
import torch.utils._pytree as pytree


@dataclasses.dataclass
class Scores:
    logits: torch.Tensor
    hidden: torch.Tensor


pytree.register_dataclass(Scores, serialized_type_name="scorelib.Scores")
"""

SAVE_ARCHIVE = """\
import torch

from scorelib import Scores


class Scorer(torch.nn.Module):
    def forward(self, x, verbose=False):
        return Scores(logits=x * 2, hidden=x + 1)


program = torch.export.export(Scorer(), (torch.ones(2, 3),), {"verbose": False})
torch.export.save(program, "scorer.pt2")
"""


EXIRC_ROOT = str(Path(__file__).resolve().parents[2])  # the checkout these tests are in


def exirc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Only the exirc under test on the path (not the archive's library folder).
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": EXIRC_ROOT}
    return warm_exirc.exirc(args, text=True, timeout=300, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("library_outputs")
    library = directory / "library"
    library.mkdir()
    (library / "scorelib.py").write_text(OUTPUT_TYPES)
    (directory / "save.py").write_text(SAVE_ARCHIVE)
    saved = subprocess.run([sys.executable, "save.py"], cwd=directory, capture_output=True,
                           text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(library)})
    assert saved.returncode == 0, saved.stderr
    return directory


def test_an_unknown_output_type_names_the_module_to_import(archive: Path) -> None:
    ran = exirc("compile", "scorer.pt2", "-o", "scorer.pte", cwd=archive)
    assert ran.returncode == 3, ran.stderr
    first, hint = ran.stderr.splitlines()[:2]
    assert first == ("error[E0310]: scorer.pt2: the program's inputs or outputs are of type "
                     "scorelib.Scores, which torch cannot rebuild until the module that "
                     "defines it is imported")
    assert hint.startswith("  hint: rerun with --import scorelib")
    assert "Traceback" not in ran.stderr and "W1" not in ran.stderr  # torch's log is kept
    assert not (archive / "scorer.pte").exists()


def test_import_loads_the_archive_and_the_constant_keyword_is_not_an_input(
        archive: Path) -> None:
    ran = exirc("compile", "scorer.pt2", "--import", "library/scorelib.py", "-o", "scorer.pte",
                cwd=archive)
    assert ran.returncode == 0, ran.stderr
    shown = exirc("inspect", "scorer.pte", cwd=archive)
    assert "inputs:  x=%" in shown.stdout  # verbose=False was specialised, not an input
    assert "outputs: logits=%" in shown.stdout and "hidden=%" in shown.stdout
    ran = exirc("run", "scorer.pte", "--random", cwd=archive)
    assert ran.returncode == 0, ran.stderr


def test_import_of_a_missing_module_is_a_usage_error(archive: Path) -> None:
    ran = exirc("compile", "scorer.pt2", "--import", "no_such_lib", "-o", "s.pte", cwd=archive)
    assert ran.returncode == 2
    assert ran.stderr.startswith("error[E0200]: cannot import the module given to --import "
                                 "'no_such_lib'")


def test_a_model_returning_a_dynamic_cache_gets_the_use_cache_hint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "gpt2.py").write_text(textwrap.dedent("""
        import torch
        import transformers

        config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                                         n_positions=16, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config).eval()
        example_inputs = {"input_ids": torch.ones(1, 4, dtype=torch.long)}
    """))
    ran = exirc("compile", "gpt2.py", "-q", "-o", "gpt2.pte", cwd=tmp_path)
    assert ran.returncode == 3, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines[0].startswith("error[E0310]: gpt2.py: cannot export method 'forward': ")
    assert "DynamicCache" in lines[0] and lines[0].endswith(".")  # whole sentences only
    assert lines[1].startswith("  hint: the model returns a transformers cache object "
                               "(DynamicCache): pass use_cache=False in example_inputs")
    assert "<string>" not in ran.stderr


def test_a_static_cache_passed_as_an_input_gets_the_cache_inside_hint(tmp_path: Path) -> None:
    # Not the hint for a returned DynamicCache (use_cache=False would not help):
    # the cache must live in the model, as buffers its methods update.
    pytest.importorskip("transformers")
    (tmp_path / "llama.py").write_text(textwrap.dedent("""
        import torch
        import transformers

        config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1)
        model = transformers.LlamaForCausalLM(config).eval()
        cache = transformers.StaticCache(config=config, max_cache_len=8)
        example_inputs = (torch.ones(1, 4, dtype=torch.long), None, None, cache)
    """))
    ran = exirc("compile", "llama.py", "-q", "-o", "llama.pte", cwd=tmp_path)
    assert ran.returncode == 3, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines[0].startswith("error[E0310]: llama.py: cannot export method 'forward': "
                               "ValueError: Unsupported input type <class "
                               "'transformers.cache_utils.StaticCache'>.")
    assert lines[1] == (
        "  hint: a transformers cache object (StaticCache) is passed as an input, and a "
        "program's inputs are tensors: keep the cache inside the model as buffers it updates "
        "(transformers' TorchExportableModuleWithStaticCache does; docs/llm.md shows the "
        "whole path)")
    assert "DynamicCache" not in ran.stderr and "use_cache" not in ran.stderr


@pytest.mark.parametrize(("text", "limit", "expected"), [
    ("short enough", 20, "short enough"),
    ("One sentence here. Another sentence that is long.", 30, "One sentence here."),
    ("a long run of words without any full stop at all", 24, "a long run of words..."),
    ("x" * 40, 10, "xxxxxxx..."),
])
def test_long_messages_are_cut_between_sentences_or_words(text: str, limit: int,
                                                          expected: str) -> None:
    assert shorten(text, limit) == expected
    assert len(shorten(text, limit)) <= limit


def test_a_module_that_fails_while_importing_is_a_usage_error(archive: Path) -> None:
    (archive / "broken.py").write_text('raise RuntimeError("boom in my module")\n')
    ran = exirc("compile", "scorer.pt2", "--import", "broken.py", "-o", "s.pte", cwd=archive)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith("error[E0200]: importing the module given to --import "
                                 "'broken.py' failed: RuntimeError: boom in my module")
    assert "Traceback" not in ran.stderr and not (archive / "s.pte").exists()
