"""The quantization zoo: small float models worth quantizing, built in-process.

Not a test module: `tests/quantize/test_zoo_quantized.py` and
`bench/quantization.py` import it. Every model is built from a seed with
random weights (transformers models from tiny configs: no downloads) and put
in eval mode, and `inputs()` gives the same example inputs every call.
Dimensions are small but realistic for quantization (hidden widths of 64 or
more), so the weight tables dominate the bytes as they do in real models and
the int8 / int4 storage ratios mean something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 512
SEQ = 16


def _randomize_norms(module: nn.Module) -> None:
    """Batch norms that are not the identity in eval mode."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.8, 1.2)
                m.bias.uniform_(-0.1, 0.1)


class MLP(nn.Module):
    """Three linear layers with ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """conv + batch norm + relu + max pool, twice, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, 10)
        _randomize_norms(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1,
             groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups,
                                   bias=False), nn.BatchNorm2d(c_out))


class MobileNetStyle(nn.Module):
    """A strided stem, a depthwise-separable block (3x3 depthwise, 1x1 pointwise),
    an inverted residual block (1x1 expand, 3x3 depthwise, 1x1 project, and the
    residual add), ReLU6 throughout, global average pooling and a classifier.

    Widths as in MobileNet's middle stages: below ~100 weights per output
    channel, the per-channel scales and int32 biases of a quantized convolution
    cost as much as its int8 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 32, 3, stride=2)
        self.dw = _conv_bn(32, 32, 3, groups=32)
        self.pw = _conv_bn(32, 128, 1)
        self.expand = _conv_bn(128, 256, 1)
        self.dw2 = _conv_bn(256, 256, 3, groups=256)
        self.project = _conv_bn(256, 128, 1)
        self.fc = nn.Linear(128, 10)
        _randomize_norms(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.stem(x))
        y = F.relu6(self.pw(F.relu6(self.dw(y))))
        y = y + self.project(F.relu6(self.dw2(F.relu6(self.expand(y)))))  # the residual
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class ViT(nn.Module):
    """transformers' ViTForImageClassification (2 layers, hidden 64): the logits."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                           num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                           num_labels=10, attn_implementation="eager")
        self.model = ViTForImageClassification(config)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels, return_dict=False)[0]


class Bert(nn.Module):
    """transformers' BertForMaskedLM (2 layers, hidden 64, vocab 512): the logits."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=128,
                            max_position_embeddings=64, attn_implementation="eager")
        self.model = BertForMaskedLM(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, return_dict=False)[0]


class GPT2(nn.Module):
    """transformers' GPT2LMHeadModel (2 layers, width 64, vocab 512): the logits."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64,
                            use_cache=False, bos_token_id=0, eos_token_id=0,
                            attn_implementation="eager")
        self.model = GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


def _tokens(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, VOCAB, (1, SEQ), generator=generator),)


@dataclass(frozen=True)
class QuantModel:
    name: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    language: bool = False  # a language model: the weight-only modes apply
    transformer: bool = False  # slow to export and compile

    def module(self) -> nn.Module:
        torch.manual_seed(sum(map(ord, self.name)))
        return self.build().eval()

    def inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Example inputs; another `seed` gives another case of the same shapes."""
        generator = torch.Generator().manual_seed(sum(map(ord, self.name)) + 1 + seed)
        return self.make_inputs(generator)


ZOO: dict[str, QuantModel] = {m.name: m for m in [
    QuantModel("mlp", MLP, lambda g: (torch.randn(8, 64, generator=g),)),
    QuantModel("cnn", CNN, lambda g: (torch.randn(1, 3, 16, 16, generator=g),)),
    QuantModel("mobilenet", MobileNetStyle, lambda g: (torch.randn(1, 3, 32, 32, generator=g),)),
    QuantModel("vit", ViT, lambda g: (torch.randn(1, 3, 32, 32, generator=g),),
               transformer=True),
    QuantModel("bert", Bert, _tokens, language=True, transformer=True),
    QuantModel("gpt2", GPT2, _tokens, language=True, transformer=True),
]}
