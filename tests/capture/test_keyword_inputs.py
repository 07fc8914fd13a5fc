"""Example inputs by keyword (`example_inputs = {"input_ids": ...}`, or a tuple plus
`example_kwargs`), as torch.export and Hugging Face models take them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from exirc.capture import load_model
from exirc.compiler import CompileOptions, compile_model
from exirc.errors import ModelError
from exirc.runtime import load
from tests.cli.test_conventions import run

ENCODER = """
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.position = torch.nn.Embedding(8, 4)

        def forward(self, input_ids, attention_mask=None, position_ids=None, *, scale=1.0):
            h = self.embed(input_ids)
            if position_ids is not None:
                h = h + self.position(position_ids)
            if attention_mask is not None:
                h = h * attention_mask.unsqueeze(-1)
            return {"hidden": h * scale, "pooled": h.mean(dim=1)}

    torch.manual_seed(0)
    model = Encoder().eval()
    ids = torch.tensor([[1, 2, 3]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    positions = torch.tensor([[0, 1, 2]])
"""


def model_file(tmp_path: Path, inputs: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(ENCODER).lstrip() + textwrap.dedent(inputs))
    return path


def compiled_outputs(path: Path, *inputs: torch.Tensor) -> list[torch.Tensor]:
    result = compile_model(str(path), CompileOptions(verify=True))
    assert result.verification is not None
    return list(load(result.data).method("forward").run(list(inputs)))


def test_a_dict_of_keyword_inputs_compiles_and_verifies(tmp_path: Path) -> None:
    path = model_file(tmp_path, 'example_inputs = {"input_ids": ids, "attention_mask": mask}\n')
    (forward,) = load_model(str(path)).methods.values()
    ids, mask = forward.example_inputs
    assert ids.shape == (1, 3) and mask.dtype == torch.float32
    outputs = compiled_outputs(path, ids, mask)
    expected = forward.module(input_ids=ids, attention_mask=mask)  # type: ignore[misc]
    torch.testing.assert_close(outputs[0], expected["hidden"])
    torch.testing.assert_close(outputs[1], expected["pooled"])


def test_a_skipped_parameter_gets_its_default(tmp_path: Path) -> None:
    # position_ids given without attention_mask: the mask is None, as in eager.
    path = model_file(tmp_path, 'example_inputs = {"input_ids": ids, "position_ids": positions}\n')
    (forward,) = load_model(str(path)).methods.values()
    ids, mask, positions = forward.example_inputs
    assert mask is None
    outputs = compiled_outputs(path, ids, positions)
    expected = forward.module(input_ids=ids, position_ids=positions)  # type: ignore[misc]
    torch.testing.assert_close(outputs[0], expected["hidden"])


def test_a_tuple_plus_example_kwargs(tmp_path: Path) -> None:
    path = model_file(tmp_path, 'example_inputs = (ids,)\n'
                                'example_kwargs = {"attention_mask": mask}\n')
    (forward,) = load_model(str(path)).methods.values()
    assert [tuple(t.shape) for t in forward.example_inputs] == [(1, 3), (1, 3)]


def test_the_program_names_its_inputs_after_the_parameters(tmp_path: Path) -> None:
    path = model_file(tmp_path, 'example_inputs = {"input_ids": ids, "attention_mask": mask}\n')
    result = compile_model(str(path))
    (exported,) = result.planned.values()
    names = [spec.arg.name for spec in exported.graph_signature.input_specs
             if spec.kind.name == "USER_INPUT"]
    assert names == ["input_ids", "attention_mask"]


@pytest.mark.parametrize(("inputs", "words"), [
    ('example_inputs = {"input_ids": ids, "mask": mask}\n',
     ["model.py:", "`example_inputs` does not fit Encoder.forward(input_ids, attention_mask",
      "unexpected keyword argument 'mask'"]),
    ('example_inputs = {"input_ids": ids, "scale": 2.0}\n',
     ["gives 'scale', which Encoder.forward", "takes only by keyword"]),
    ('example_inputs = {"attention_mask": mask}\n',
     ["does not fit", "missing a required argument: 'input_ids'"]),
    ('example_inputs = (ids,)\nexample_kwargs = [mask]\n',
     ["`example_kwargs` is a list of 1 item, expected a dict of keyword inputs"]),
])
def test_keyword_inputs_that_do_not_fit_name_the_parameter(tmp_path: Path, inputs: str,
                                                            words: list[str]) -> None:
    path = model_file(tmp_path, inputs)
    with pytest.raises(ModelError) as raised:
        load_model(str(path))
    for word in words:
        assert word in raised.value.message, raised.value.message


def test_a_keyword_that_reaches_kwargs_is_named_by_its_own_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # transformers' decoders take `cache_position` (and more) through **kwargs:
    # the message names the keyword the user gave, not the parameter `kwargs`.
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch

        class Decoder(torch.nn.Module):
            def forward(self, input_ids, **kwargs):
                return input_ids * 2

        model = Decoder()
        example_inputs = {"input_ids": torch.ones(1, 3), "cache_position": torch.arange(3)}
    """))
    code, _, err = run(capsys, "compile", str(tmp_path / "model.py"), "-o",
                       str(tmp_path / "model.pte"))
    assert code == 3, err
    assert err.splitlines()[:2] == [
        f"error[E0310]: {tmp_path / 'model.py'}:9: `example_inputs` gives 'cache_position', "
        "which Decoder.forward(input_ids, **kwargs) takes only through **kwargs; exirc passes "
        "a program's inputs positionally",
        "  hint: wrap the model in an nn.Module whose forward takes the input positionally "
        "and passes it on by keyword"]


def test_keyword_only_and_kwargs_keywords_are_named_together(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch

        class Decoder(torch.nn.Module):
            def forward(self, input_ids, *, scale=1.0, **kwargs):
                return input_ids * scale

        model = Decoder()
        example_inputs = {"input_ids": torch.ones(1, 3), "scale": 2.0, "extra": 1, "more": 2}
    """))
    with pytest.raises(ModelError) as raised:
        load_model(str(tmp_path / "model.py"))
    assert "gives 'scale', 'extra', 'more', which Decoder.forward(input_ids, *, scale=1.0, " \
           "**kwargs) takes only by keyword or **kwargs;" in raised.value.message


def test_keyword_inputs_of_a_transformers_model(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    del transformers
    path = tmp_path / "bert.py"
    path.write_text(textwrap.dedent("""
        import torch
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                            num_attention_heads=2, intermediate_size=32,
                            max_position_embeddings=16)
        model = BertModel(config).eval()
        example_inputs = {"input_ids": torch.randint(0, 64, (1, 6)),
                          "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    """))
    result = compile_model(str(path), CompileOptions(verify=True))
    assert result.verification is not None
    (exported,) = result.planned.values()
    names = [spec.arg.name for spec in exported.graph_signature.input_specs
             if spec.kind.name == "USER_INPUT"]
    assert names[:2] == ["input_ids", "attention_mask"]
