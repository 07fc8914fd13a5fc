"""Models that ExecuTorch's XnnpackPartitioner lowers, for comparing runtimes.

Not a test module. Each `ZooModel` builds a small eval-mode module with
seeded weights and example inputs; `executorch_xnnpack_pte` lowers it with
`to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])`, as a
user would. Nothing here imports ExecuTorch or transformers at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests.shared_files import module_digest, origin, shared


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 32), nn.Linear(32, 16), nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = F.hardtanh(self.fc2(x), -0.5, 0.5)
        return self.fc3(x)


class ConvBnReluPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2, padding=1)
        return torch.relu(self.conv2(y))


class MobileNetBlock(nn.Module):
    """Inverted residual: 1x1 expand, relu6, 3x3 depthwise, 1x1 project, residual."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(8, 24, 1)
        self.depthwise = nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.project = nn.Conv2d(24, 8, 1)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=8)  # multiplier 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.expand(x))
        y = F.relu6(self.depthwise(y))
        y = self.project(y) + x
        return F.hardswish(self.down(y))


class ConvTranspose(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
        self.grouped = nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.grouped(torch.relu(self.up(x)))


class Pooling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3)
        self.adaptive = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        avg = F.avg_pool2d(y, 3, stride=2, padding=1, count_include_pad=False)
        plain = F.avg_pool2d(y, 2)
        return avg, self.adaptive(plain).flatten(1)


class TensorOps(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.cat([x, y * 2.0, x - y], dim=1)          # [2, 9, 4]
        p = c.permute(0, 2, 1)                              # [2, 4, 9]
        s = p[:, 1:3, 2:8]                                  # [2, 2, 6]
        padded = F.pad(s, (1, 2, 0, 1), value=0.5)          # [2, 3, 9]
        return torch.softmax(padded, dim=-1), torch.softmax(c.reshape(2, 36) / 3, dim=-1)


class Upsample(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        b = F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True)
        return a, b


class Activations(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [F.gelu(x), torch.sigmoid(x), torch.tanh(x), F.hardswish(x),
                 F.leaky_relu(x, 0.1), F.elu(x, 0.8), torch.abs(x), -x,
                 torch.clamp(x, -0.7, 0.9), torch.sqrt(torch.abs(x)), torch.exp(x * 0.5),
                 torch.maximum(x, x * 0.3), torch.minimum(x, x * 0.3), x / (x.abs() + 1),
                 torch.floor(x), torch.ceil(x), x * x, torch.rsqrt(x.abs() + 1),
                 torch.log(x.abs() + 1)]
        return torch.stack(parts).sum(0)


class MoreOps(nn.Module):
    """sin, cos, square (pow 2), PReLU per channel, two- and four-way cat."""

    def __init__(self) -> None:
        super().__init__()
        self.prelu = nn.PReLU(3, init=0.1)
        with torch.no_grad():
            self.prelu.weight.copy_(torch.tensor([0.1, -0.5, 2.0]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.prelu(x)                                               # [1, 3, 4, 5]
        two = torch.cat([torch.sin(y), torch.cos(y)], dim=1)            # [1, 6, 4, 5]
        four = torch.cat([y, y ** 2, -y, y * 0.5], dim=3)               # [1, 3, 4, 20]
        return two, four


class Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = (z.reshape(b * self.heads, t, self.head_dim) for z in (q, k, v))
        scores = torch.bmm(q, k.transpose(1, 2)) * self.head_dim ** -0.5
        y = torch.bmm(torch.softmax(scores, -1), v)
        y = y.reshape(b, self.heads, t, self.head_dim).permute(0, 2, 1, 3).reshape(b, t, d)
        return self.out(y) + torch.matmul(x, x.transpose(1, 2)) @ x * 0.01


class TinyViT(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)  # [B, 16, dim]
        h = self.norm1(tokens)
        tokens = tokens + self.attn(h, h, h, need_weights=False)[0]
        tokens = tokens + self.mlp(self.norm2(tokens))
        return self.head(tokens.mean(1))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        attn_implementation="eager")
    return _Hidden(GPT2Model(config))


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=48, max_position_embeddings=32,
                        attn_implementation="eager")
    return _Hidden(BertModel(config))


class _Hidden(nn.Module):
    """A transformers model returning only its last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    dynamic_shapes: Callable[[], Any] | None = None
    needs: str | None = None  # an optional package the model comes from

    def module(self) -> nn.Module:
        torch.manual_seed(sum(map(ord, self.name)))
        return self.build().eval()

    def inputs(self) -> tuple[torch.Tensor, ...]:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(sum(map(ord, self.name)) + 1)
            return self.make_inputs()
        finally:
            torch.random.set_rng_state(state)


def _ids() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 64, (2, 10)),)


def _dynamic_batch() -> Any:
    return ({0: torch.export.Dim("batch", min=1, max=8)},)


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("mlp", MLP, lambda: (torch.randn(3, 12),)),
    ZooModel("mlp_dynamic_batch", MLP, lambda: (torch.randn(4, 12),),
             dynamic_shapes=_dynamic_batch),
    ZooModel("conv_bn_relu_maxpool", ConvBnReluPool, lambda: (torch.randn(2, 3, 12, 11),)),
    ZooModel("mobilenet_block", MobileNetBlock, lambda: (torch.randn(1, 8, 10, 10),)),
    ZooModel("conv_transpose", ConvTranspose, lambda: (torch.randn(1, 6, 5, 4),)),
    ZooModel("pooling", Pooling, lambda: (torch.randn(2, 4, 13, 12),)),
    ZooModel("tensor_ops", TensorOps, lambda: (torch.randn(2, 3, 4), torch.randn(2, 3, 4))),
    ZooModel("upsample_bilinear", Upsample, lambda: (torch.randn(1, 3, 5, 6),)),
    ZooModel("activations", Activations, lambda: (torch.randn(4, 7) * 2,)),
    ZooModel("more_ops", MoreOps, lambda: (torch.randn(1, 3, 4, 5),)),
    ZooModel("attention", Attention, lambda: (torch.randn(2, 6, 16),)),
    ZooModel("tiny_vit", TinyViT, lambda: (torch.randn(2, 3, 16, 16),)),
    ZooModel("gpt2_tiny", _gpt2, _ids, needs="transformers"),
    ZooModel("bert_tiny", _bert, _ids, needs="transformers"),
]}


HALF_MODELS = ["mlp", "conv_bn_relu_maxpool", "mobilenet_block", "attention", "activations"]
"""Zoo models also lowered in fp16 (ExecuTorch keeps convolution weights fp32)."""


def half_inputs(model: ZooModel) -> tuple[torch.Tensor, ...]:
    return tuple(t.half() for t in model.inputs())


def executorch_xnnpack_pte(model: ZooModel, half: bool = False) -> bytes:
    """The model lowered to XNNPACK by ExecuTorch, as `.pte` bytes (in fp16 if `half`);
    made once per test run (`tests.shared_files`: four modules lower zoo models)."""
    inputs = [(t.dtype, tuple(t.shape)) for t in model.inputs()]
    key = (f"executorch xnnpack {origin(model.build)} {model.name} {inputs} half={half} "
           f"dynamic={model.dynamic_shapes is not None} {module_digest(model.module())}")
    return shared(key, lambda: _lowered_by_executorch(model, half))


def _lowered_by_executorch(model: ZooModel, half: bool) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    dynamic = model.dynamic_shapes() if model.dynamic_shapes else None
    module = model.module().half() if half else model.module()
    inputs = half_inputs(model) if half else model.inputs()
    with torch.no_grad():
        exported = torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer)


def run_with_executorch_runtime(pte: bytes, inputs: tuple[torch.Tensor, ...]
                                ) -> list[torch.Tensor]:
    """ExecuTorch's own runtime (with its XNNPACK backend) on the program."""
    from tests.oracle import executorch_method

    outputs = executorch_method(pte)([t.clone() for t in inputs])
    return [o.clone() for o in outputs]


def eager(model: ZooModel) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model.module()(*model.inputs())
    return list(out) if isinstance(out, (tuple, list)) else [out]
