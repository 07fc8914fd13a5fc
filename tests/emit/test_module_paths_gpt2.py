"""A Hugging Face model behind a one-line wrapper: its instructions name the
transformer's submodules and transformers' own lines, not just the wrapper."""

from __future__ import annotations

import pytest
import torch

from exirc.compiler import compile_module
from exirc.serialize import read_program_file
from exirc.serialize.module_paths import stored_module_paths

transformers = pytest.importorskip("transformers")


class Wrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50,
                                         n_positions=16)
        self.model = transformers.GPT2LMHeadModel(config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, use_cache=False).logits


@pytest.mark.slow
def test_gpt2_instructions_point_into_the_transformer() -> None:
    torch.manual_seed(0)
    wrapper = Wrapper().eval()
    program = read_program_file(compile_module(wrapper, (torch.randint(0, 50, (1, 8)),)).data
                                ).program
    plan = program.execution_plan[0]
    stored = stored_module_paths(program).of_plan(plan)
    assert stored is not None
    (paths,) = stored
    (chain,) = plan.chains
    at = paths.index("model.transformer.h.0.attn.c_attn")  # the attention's projection
    wrapper.get_submodule(paths[at])
    frames = chain.stacktrace[at].items
    assert frames[0].filename.endswith("test_module_paths_gpt2.py")  # the wrapper's line...
    assert frames[0].context == "return self.model(ids, use_cache=False).logits"
    library = frames[-1]  # ...and transformers' line below it, without site-packages
    assert library.filename.startswith("transformers/")
    assert library.filename in ("transformers/pytorch_utils.py",  # Conv1D's addmm
                                "transformers/models/gpt2/modeling_gpt2.py")
    assert "site-packages" not in library.filename and library.lineno > 0
    inside = {f.filename for f in (fl.items[-1] for fl in chain.stacktrace if fl.items)}
    assert "transformers/models/gpt2/modeling_gpt2.py" in inside
