"""The conformance zoo: small, deterministic models the compiler must get right.

Not a test module: a registry the compiler tests (`tests/compile/`) and the
compile benchmark (`bench/compile.py`) import. Each model is built from a
seeded generator and put in eval mode, so every build of a model has the same
weights and every call of `inputs()` the same example inputs.

Together the models cover the families a PyTorch-to-edge compiler meets in
practice (MLPs, CNNs with batch norm and pooling, residual and depthwise
blocks, attention, embeddings, recurrent nets, elementwise math, reductions,
indexing, slicing, cat and split, and Hugging Face GPT-2 and BERT) and, after
ExecuTorch's `to_edge`, more than 80 distinct core ATen operators
(`python -m tests.models.op_coverage` counts them). Every model runs on
ExecuTorch's portable runtime when lowered by ExecuTorch itself.

Sizes are kept small: ExecuTorch lowers the whole zoo in about two minutes
on a busy two-core machine, most of it in the recurrent and transformer
models (their graphs have hundreds of nodes). Tolerances are float32's
rtol 1e-4, atol 1e-5 for every model today (ExecuTorch's own lowering stays
within 1e-6 of eager on all of them); a model that ever needs looser ones
must say why in `tolerance_note`.
"""

from __future__ import annotations

import importlib.util
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

# Families: every model carries one or more of these tags.
FAMILIES = (
    "mlp", "cnn", "batch_norm", "pooling", "residual", "depthwise", "attention", "softmax",
    "layer_norm", "embedding", "lstm", "gru", "elementwise", "reductions", "indexing",
    "slicing", "cat_split", "transformers", "integer",
)


# --------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------


def _give_norms_statistics(module: nn.Module) -> None:
    """Non-trivial running statistics and affine parameters for every batch
    norm, so that (in eval mode) none of them is the identity."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                assert m.running_var is not None
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.8, 1.2)
                    m.bias.uniform_(-0.1, 0.1)


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    )


# --------------------------------------------------------------------------
# MLPs.
# --------------------------------------------------------------------------


class AddOnes(nn.Module):
    """x + 1, `length` times: a chain of tiny kernels (the interpreter's own cost)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.length):
            x = x + 1
        return x


class MLP(nn.Module):
    """Three linear layers with GELU and ReLU: addmm, permute, constant weights."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(32, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MLPActivations(nn.Module):
    """One linear layer, then the usual activations side by side, log_softmax out."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 24)
        self.head = nn.Linear(24 * 9, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        acts = [
            torch.sigmoid(h), torch.tanh(h), F.silu(h), F.elu(h), F.leaky_relu(h, 0.1),
            F.hardtanh(h, -0.5, 0.5), F.softplus(h), F.hardswish(h), F.gelu(h, approximate="tanh"),
        ]
        return F.log_softmax(self.head(torch.cat(acts, dim=-1)), dim=-1)


# --------------------------------------------------------------------------
# CNNs.
# --------------------------------------------------------------------------


class CNNBatchNormPool(nn.Module):
    """conv + batch norm + relu, max pool, avg pool, adaptive pool, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    """ResNet's basic block: two conv-bn, a shortcut (1x1 conv-bn when strided)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(c_in, c_out, 3, stride)
        self.conv2 = conv_bn(c_out, c_out, 3)
        self.shortcut: nn.Module = (
            conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv2(F.relu(self.conv1(x))) + self.shortcut(x))


class ResNetTiny(nn.Module):
    """Stem, max pool, two residual blocks (one strided), global pool, fc."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 8, 3), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1))
        self.blocks = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.fc(y.mean(dim=(2, 3)))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expand, depthwise 3x3, squeeze-excite, 1x1 project."""

    def __init__(self, channels: int, expand: int) -> None:
        super().__init__()
        hidden = channels * expand
        self.expand = conv_bn(channels, hidden, 1)
        self.depthwise = conv_bn(hidden, hidden, 3, groups=hidden)
        self.se_reduce = nn.Conv2d(hidden, hidden // 4, 1)
        self.se_expand = nn.Conv2d(hidden // 4, hidden, 1)
        self.project = conv_bn(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.hardswish(self.expand(x))
        h = F.relu6(self.depthwise(h))
        s = F.adaptive_avg_pool2d(h, 1)
        s = F.hardsigmoid(self.se_expand(F.relu(self.se_reduce(s))))
        return x + self.project(h * s)


class MobileNetTiny(nn.Module):
    """Depthwise-separable convolutions: a strided depthwise stem and two
    inverted residual blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn(3, 8, 3, stride=2)
        self.dw = conv_bn(8, 8, 3, groups=8)
        self.pw = conv_bn(8, 16, 1)
        self.blocks = nn.Sequential(InvertedResidual(16, 2), InvertedResidual(16, 3))
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.stem(x))
        y = F.relu6(self.pw(F.relu6(self.dw(y))))
        y = self.blocks(y)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class TemporalConv1d(nn.Module):
    """1-D convolutions over time: dilation, batch norm 1d, max and avg pool 1d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(4, 8, 5, padding=2)
        self.bn1 = nn.BatchNorm1d(8)
        self.conv2 = nn.Conv1d(8, 8, 3, padding=2, dilation=2)
        self.bn2 = nn.BatchNorm1d(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool1d(F.relu(self.bn1(self.conv1(x))), 2)
        y = F.avg_pool1d(torch.tanh(self.bn2(self.conv2(y))), 2)
        return self.fc(y.amax(dim=-1))


class UNetTiny(nn.Module):
    """Encoder-decoder with skip connections: transposed conv, nearest and
    bilinear upsampling, cat of feature maps, group norm."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.bottleneck = nn.Conv2d(16, 16, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.dec2 = nn.Conv2d(32, 8, 3, padding=1)
        self.dec1 = nn.Conv2d(16, 4, 3, padding=1)
        self.out = nn.Conv2d(4 + 2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)  # 16x16
        e2 = self.enc2(F.max_pool2d(e1, 2))  # 8x8
        b = F.relu(self.bottleneck(F.max_pool2d(e2, 2)))  # 4x4
        d2 = F.relu(self.dec2(torch.cat([self.up2(b), e2], dim=1)))  # 8x8
        d2 = F.interpolate(d2, scale_factor=2.0, mode="nearest")  # 16x16
        d1 = F.relu(self.dec1(torch.cat([d2, e1], dim=1)))
        d1 = F.interpolate(d1, size=(32, 32), mode="bilinear", align_corners=False)
        x_up = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=True)
        return torch.sigmoid(self.out(torch.cat([d1, x_up], dim=1)))


class NormsAndPadding(nn.Module):
    """Instance norm, padding modes, pixel (un)shuffle: image-to-image layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 16, 3)
        self.norm = nn.InstanceNorm2d(16, affine=True)
        self.conv2 = nn.Conv2d(16, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(F.pad(x, (1, 1, 1, 1), mode="reflect"))
        y = F.relu(self.norm(y))
        y = F.pixel_shuffle(y, 2)  # [N, 4, 2H, 2W]
        y = F.pad(y, (1, 1, 1, 1), mode="replicate")
        y = F.pixel_unshuffle(y, 2)  # [N, 16, H+1, W+1]
        y = self.conv2(F.pad(y, (1, 0, 1, 0), value=0.5))
        return y


# --------------------------------------------------------------------------
# Attention.
# --------------------------------------------------------------------------


class CausalSelfAttentionBlock(nn.Module):
    """A pre-norm decoder block written by hand: layer norm, fused qkv,
    heads by reshape/permute, a causal mask (tril, masked_fill), softmax,
    a GELU MLP and two residuals."""

    def __init__(self, dim: int = 32, heads: int = 4, seq: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TorchTransformerEncoder(nn.Module):
    """nn.TransformerEncoder (two layers, post-norm, ReLU) with nn.MultiheadAttention."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class ViTTiny(nn.Module):
    """A vision transformer: patch-embedding conv, class token (cat),
    learned positions, scaled_dot_product_attention, layer norm, GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.patch = nn.Conv2d(3, dim, kernel_size=4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({
                "ln1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim),
                "proj": nn.Linear(dim, dim), "ln2": nn.LayerNorm(dim),
                "fc1": nn.Linear(dim, 2 * dim), "fc2": nn.Linear(2 * dim, dim),
            })
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch(img).flatten(2).transpose(1, 2)  # [B, 16, dim]
        b, _, c = x.shape
        x = torch.cat([self.cls.expand(b, -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            qkv = blk["qkv"](blk["ln1"](x)).reshape(b, -1, 3, self.heads, c // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            y = F.scaled_dot_product_attention(q, k, v)
            x = x + blk["proj"](y.transpose(1, 2).reshape(b, -1, c))
            x = x + blk["fc2"](F.gelu(blk["fc1"](blk["ln2"](x))))
        return self.head(self.norm(x[:, 0]))


# --------------------------------------------------------------------------
# Embeddings and recurrent nets.
# --------------------------------------------------------------------------


class EmbeddingClassifier(nn.Module):
    """Token and position embeddings (arange), a padding mask from the ids,
    masked mean pooling, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 16, padding_idx=0)
        self.positions = nn.Embedding(12, 16)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.norm(self.tokens(ids) + self.positions(positions))
        keep = (ids != 0).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.fc(pooled)


class LSTMTagger(nn.Module):
    """Embedding, a two-layer LSTM, per-step tags and the final hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.tag = nn.Linear(16, 5)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, (h, _) = self.lstm(self.emb(ids))
        return self.tag(out), h


class GRUEncoder(nn.Module):
    """A bidirectional GRU over a feature sequence, with an initial state."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(6, 12, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x, h0)
        return self.fc(out[:, -1])


# --------------------------------------------------------------------------
# Elementwise math, comparisons, integers.
# --------------------------------------------------------------------------


class UnaryMath(nn.Module):
    """Unary elementwise math, each on inputs inside its domain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = x.abs() + 0.5  # > 0
        unit = torch.tanh(x) * 0.9  # in (-1, 1)
        terms = [
            torch.exp(x), torch.expm1(x), torch.log(pos), torch.log1p(pos), torch.log2(pos),
            torch.log10(pos), torch.sqrt(pos), torch.rsqrt(pos), torch.reciprocal(pos),
            torch.sin(x), torch.cos(x), torch.tan(unit), torch.asin(unit), torch.acos(unit),
            torch.atan(x), torch.sinh(x), torch.cosh(x), torch.asinh(x), torch.atanh(unit),
            torch.acosh(pos + 1.0), torch.erf(x), torch.sign(x), torch.neg(x),
            torch.sigmoid(x), torch.logit(torch.sigmoid(x) * 0.8 + 0.1),
        ]
        # Rounding of values kept away from .5 boundaries.
        r = x * 3.0 + 0.25
        terms += [torch.floor(r), torch.ceil(r), torch.round(r), torch.trunc(r)]
        return torch.stack(terms)


class BinaryMath(nn.Module):
    """Binary elementwise math with broadcasting, scalars and rounding modes."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ypos = y.abs() + 0.5
        terms = [
            x + y, x - 2.0 * y, 1.0 - x, x * y, x / ypos,
            torch.div(x * 4.0, ypos, rounding_mode="floor"),
            torch.div(x * 4.0, ypos, rounding_mode="trunc"),
            torch.pow(ypos, x), torch.pow(x, 2), torch.pow(2.0, x), torch.atan2(x, y),
            torch.maximum(x, y), torch.minimum(x, y), torch.fmod(x * 4.0, ypos),
            torch.remainder(x * 4.0, ypos), torch.clamp(x, min=-0.5),
            torch.clamp(x, y - 1.0, y + 1.0),
            torch.lerp(x, y, 0.3), torch.where(x > y, x, y * 0.5),
            torch.addcmul(x, y, ypos, value=0.5),
        ]
        return torch.stack(terms) + x[0:1]  # broadcast a row back over all terms


class CompareLogical(nn.Module):
    """Comparisons, logical ops, isnan/isinf, casts between bool and float."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gt, lt, ge, le = x > y, x < y, x >= 0.5, x <= -0.5
        eq, ne = torch.round(x) == torch.round(y), x != y
        inf = x / (y > 0).to(x.dtype)  # +-inf where y <= 0, x / 0
        masks = torch.stack([
            torch.logical_and(gt, ge), torch.logical_or(lt, le), torch.logical_xor(gt, eq),
            torch.logical_not(ne), torch.isinf(inf), torch.isnan(inf - inf),
            gt & ~le, lt | eq, gt ^ ge, (x > 0).any(dim=-1, keepdim=True).expand_as(x),
        ])
        count = masks.to(torch.float32).sum(dim=0)
        return masks, count * torch.where(gt, x, -y)


class IntegerMath(nn.Module):
    """int64 arithmetic: floor division, remainder, bitwise ops, integer
    reductions, int <-> float casts. No shifts: `<<` and `>>` are not core
    ATen, and ExecuTorch's `to_edge` rejects them. Integer remainder only of
    non-negative numbers: ExecuTorch 1.5.1's portable kernel truncates
    (`-6 % 4` gives -2, not 2), so the oracle cannot judge negative ones."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bpos = b.abs() + 1
        r = torch.stack([
            a + b, a - b, a * b, torch.floor_divide(a, bpos), torch.remainder(a.abs(), bpos),
            a & b, a | b, a ^ b, ~a, torch.abs(a), torch.clamp(a, -3, 3),
            torch.maximum(a, b), torch.minimum(a, b), torch.neg(b),
        ])
        summary = torch.stack([r.sum(dim=0), r.cumsum(dim=0)[-1], r.amax(dim=0), r.argmax(dim=0)])
        return summary, r.to(torch.float32).mean(dim=0) * 0.5


# --------------------------------------------------------------------------
# Reductions, indexing, slicing, cat and split, matmuls.
# --------------------------------------------------------------------------


class Reductions(nn.Module):
    """Sums, means, extrema (values and indices), variance, std, products,
    cumulative sums, logsumexp, norms, top-k."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = x.max(dim=1)
        min_values, _ = x.min(dim=-1, keepdim=True)
        features = torch.cat([
            x.sum(dim=(1, 2)), x.mean(dim=-1).flatten(), x.amax(dim=(0, 2)),
            x.amin(dim=0).flatten(),
            values.flatten(), min_values.flatten(), x.var(dim=1, unbiased=False).flatten(),
            x.std(dim=-1).flatten(), torch.prod(x * 0.5 + 1.0, dim=1).flatten(),
            torch.logsumexp(x, dim=-1).flatten(), torch.linalg.vector_norm(x, dim=-1).flatten(),
            torch.cumsum(x, dim=2).flatten(), x.sum().unsqueeze(0),
        ])
        top_values, top_indices = torch.topk(x.flatten(1), k=3, dim=1)
        arg = torch.stack([x.argmax(dim=1), x.argmin(dim=1)])
        return features, top_values, top_indices, indices, arg


class Indexing(nn.Module):
    """Advanced indexing, index_select, gather, scatter, scatter_add,
    index_put, masked_fill, select, and an index computed at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("rows", torch.tensor([3, 0, 2]))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = x[idx]  # [4, 6]
        grid = x[self.rows[:, None], idx[None, :2]]  # two index tensors, broadcast: [3, 2]
        sel = torch.index_select(x, 1, idx)  # [5, 4]
        gathered = torch.gather(x, 1, idx.unsqueeze(0).expand(5, -1))  # [5, 4]
        scattered = torch.zeros(5, 6).scatter(1, idx[:3].unsqueeze(0).expand(5, -1), x[:, :3])
        added = torch.zeros(5, 6).scatter_add(0, idx.unsqueeze(1).expand(-1, 6), x[:4])
        put = x.index_put((idx,), torch.ones(4, 6) * 7.0, accumulate=True)
        filled = x.masked_fill(x < 0, 0.25)
        row = x[2] + x[:, 3].sum() + x[-1, -1]
        dynamic_pick = x[x.argmax(dim=0)[:1]]  # a row chosen by the data
        assigned = x.clone()
        assigned[:, 1:3] = -1.0  # slice assignment: slice_scatter once functional
        assigned[4] = x[0] * 2.0  # row assignment: select_scatter
        return (
            picked, grid, sel, gathered, scattered, added, put, filled, row, dynamic_pick,
            assigned,
        )


class SlicingViews(nn.Module):
    """Views and layout changes: strided slices, narrow, permute, transpose,
    reshape, (un)squeeze, expand, flip, roll, repeat, tril, diagonal,
    repeat_interleave, a clone of a non-contiguous view."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x[:, 1:7:2, ::2]  # [2, 3, 4]
        b = x.narrow(2, 2, 4).permute(2, 0, 1)  # [4, 2, 8]
        c = x.transpose(1, 2).reshape(2, -1)[:, :10]  # [2, 10]
        d = x[0].unsqueeze(0).unsqueeze(-1).squeeze(0).expand(8, 8, 3)  # [8, 8, 3]
        e = torch.flip(x, dims=[1, 2]) + torch.roll(x, shifts=(1, -2), dims=(1, 2))
        f = x[1, :3, :3].repeat(2, 3)  # [6, 9]
        g = torch.tril(x[0]) - torch.triu(x[1], diagonal=1)
        h = torch.diagonal(x, dim1=1, dim2=2)  # [2, 8]
        i = x[0, 0:3, ::2].contiguous()  # [3, 4]
        j = torch.repeat_interleave(x[:, 0, :4], 2, dim=1)  # [2, 8]
        k = x[0].t().contiguous()  # [8, 8]
        m = x.select(1, 3).flatten()  # [16]
        return a, b, c, d, e, f, g, h, i, j, k, m


class CatSplit(nn.Module):
    """cat, stack, split with equal and uneven sizes, chunk, unbind,
    tensor_split, hstack/vstack."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p, q = torch.split(x, 3, dim=1)  # [4, 3] x 2
        r, s, t = torch.split(y, [1, 2, 3], dim=1)  # uneven
        u = torch.chunk(x, 2, dim=0)
        rows = torch.unbind(y, dim=0)
        head, tail = torch.tensor_split(x, [1], dim=0)
        joined = torch.cat([p * 2.0, t, q], dim=1)  # [4, 9]
        stacked = torch.stack([p, q, s.repeat(1, 2)[:, :3]], dim=-1)  # [4, 3, 3]
        h = torch.hstack([r, s]) - torch.vstack([u[1], u[0]])[:, :3]
        return joined, stacked, h, rows[2] * rows[0], head + tail.sum(dim=0)


class MatmulVariants(nn.Module):
    """mm, bmm, broadcast matmul, linear without bias, einsum, baddbmm,
    addmm, outer products, cdist."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 5, bias=False)
        self.w = nn.Parameter(torch.randn(6, 6) * 0.3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # x: [3, 4, 6], y: [3, 6, 4]
        a = torch.bmm(x, y)  # [3, 4, 4]
        b = x @ self.w  # broadcast batched matmul: [3, 4, 6]
        c = torch.mm(x[0], y[0])
        d = self.proj(x)  # [3, 4, 5]
        e = torch.einsum("bij,bjk->bik", x, y) * 0.5 + torch.baddbmm(a, x, y, beta=0.5)
        f = torch.addmm(c, x[1], y[1], alpha=2.0)
        g = torch.outer(x[0, 0], y[0, :, 0])
        h = torch.cdist(x[0], x[1])
        return a, b, d, e, f, g, h


# --------------------------------------------------------------------------
# Hugging Face transformers, built from tiny configs (no downloads).
# --------------------------------------------------------------------------


class GPT2LMHead(nn.Module):
    """transformers' GPT2LMHeadModel (2 layers, width 32, 2 heads, vocab 100):
    the logits as one tensor."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2,
            use_cache=False, bos_token_id=0, eos_token_id=0, attn_implementation="eager",
        )
        self.model = GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


class GPT2Hidden(nn.Module):
    """transformers' GPT2Model with an attention mask (left padding):
    the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(
            vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2,
            use_cache=False, bos_token_id=0, eos_token_id=0, attn_implementation="eager",
        )
        self.model = GPT2Model(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=False
        )
        return out[0]


class BertEncoder(nn.Module):
    """transformers' BertModel (2 layers, hidden 32, 2 heads, vocab 100) with
    token types and an attention mask: the last hidden state and the pooler."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=16, attn_implementation="eager",
        )
        self.model = BertModel(config)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
            return_dict=False,
        )
        return out[0], out[1]


def _gpt2_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 100, (1, 8)),)


def _gpt2_masked_inputs() -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, :3] = 0  # the second sequence is left-padded
    return ids, mask


def _bert_inputs() -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, 100, (2, 8))
    types = torch.zeros(2, 8, dtype=torch.int64)
    types[:, 5:] = 1
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0  # the second sequence is right-padded
    return ids, types, mask


# --------------------------------------------------------------------------
# The registry.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooModel:
    """A zoo model: how to build it, its example inputs, what it exercises,
    and how close its compiled outputs must be to eager PyTorch."""

    name: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    families: tuple[str, ...]
    rtol: float = 1e-4
    atol: float = 1e-5
    tolerance_note: str = ""
    dynamic_shapes: Callable[[], Any] | None = None
    requires: tuple[str, ...] = ()  # optional packages the model needs

    @property
    def available(self) -> bool:
        """Whether the packages the model needs are installed."""
        return all(importlib.util.find_spec(package) is not None for package in self.requires)

    def module(self) -> nn.Module:
        """A fresh instance, seeded weights, eval mode."""
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(_seed(self.name))
            module = self.build()
            _give_norms_statistics(module)
        finally:
            torch.random.set_rng_state(state)
        return module.eval()

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """Fresh copies of the example inputs (the same values every call)."""
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(_seed(self.name) + 1)
            return self.make_inputs()
        finally:
            torch.random.set_rng_state(state)

    def reference_outputs(self) -> list[torch.Tensor]:
        """Eager PyTorch outputs on the example inputs, flattened."""
        with torch.no_grad():
            out = self.module()(*self.inputs())
        return flatten_outputs(out)


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    """A model's outputs as a flat list of tensors, in pytree order (the
    order a compiled program returns them in)."""
    return list(torch.utils._pytree.tree_leaves(out))


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) % 10_000


def _ids(high: int, shape: tuple[int, ...], pad: int = 0) -> torch.Tensor:
    """Token ids in [1, high), with the last `pad` positions of row 0 set to 0."""
    ids = torch.randint(1, high, shape)
    if pad:
        ids[0, -pad:] = 0
    return ids


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("mlp", MLP, lambda: (torch.randn(4, 16),), ("mlp",)),
        ZooModel(
            "mlp_activations", MLPActivations, lambda: (torch.randn(3, 12),),
            ("mlp", "elementwise", "softmax", "cat_split"),
        ),
        ZooModel(
            "cnn_bn_pool", CNNBatchNormPool, lambda: (torch.randn(2, 3, 16, 16),),
            ("cnn", "batch_norm", "pooling"),
        ),
        ZooModel(
            "resnet_tiny", ResNetTiny, lambda: (torch.randn(1, 3, 16, 16),),
            ("cnn", "batch_norm", "pooling", "residual"),
        ),
        ZooModel(
            "mobilenet_tiny", MobileNetTiny, lambda: (torch.randn(1, 3, 16, 16),),
            ("cnn", "batch_norm", "pooling", "residual", "depthwise"),
        ),
        ZooModel(
            "temporal_conv1d", TemporalConv1d, lambda: (torch.randn(2, 4, 32),),
            ("cnn", "batch_norm", "pooling", "reductions"),
        ),
        ZooModel(
            "unet_tiny", UNetTiny, lambda: (torch.randn(1, 2, 16, 16),),
            ("cnn", "pooling", "cat_split"),
        ),
        ZooModel(
            "norms_padding", NormsAndPadding, lambda: (torch.randn(1, 4, 6, 6),),
            ("cnn", "slicing"),
        ),
        ZooModel(
            "causal_attention", CausalSelfAttentionBlock, lambda: (torch.randn(2, 8, 32),),
            ("attention", "softmax", "layer_norm", "residual", "slicing", "indexing"),
        ),
        ZooModel(
            "torch_transformer", TorchTransformerEncoder, lambda: (torch.randn(2, 6, 32),),
            ("attention", "softmax", "layer_norm", "residual"),
        ),
        ZooModel(
            "vit_tiny", ViTTiny, lambda: (torch.randn(1, 3, 16, 16),),
            ("attention", "softmax", "layer_norm", "residual", "cnn", "cat_split"),
        ),
        ZooModel(
            "embedding_classifier", EmbeddingClassifier, lambda: (_ids(50, (3, 10), pad=4),),
            ("embedding", "layer_norm", "reductions", "integer"),
        ),
        ZooModel(
            "lstm_tagger", LSTMTagger, lambda: (_ids(30, (2, 4)),), ("lstm", "embedding"),
        ),
        ZooModel(
            "gru_bidirectional", GRUEncoder,
            lambda: (torch.randn(2, 4, 6), torch.randn(2, 2, 12) * 0.1), ("gru",),
        ),
        ZooModel("unary_math", UnaryMath, lambda: (torch.randn(3, 7),), ("elementwise",)),
        ZooModel(
            "binary_math", BinaryMath, lambda: (torch.randn(4, 5), torch.randn(4, 5)),
            ("elementwise",),
        ),
        ZooModel(
            "compare_logical", CompareLogical, lambda: (torch.randn(4, 6), torch.randn(4, 6)),
            ("elementwise", "reductions"),
        ),
        ZooModel(
            "integer_math", IntegerMath,
            lambda: (torch.randint(-20, 20, (3, 4)), torch.randint(-5, 5, (3, 4))),
            ("elementwise", "integer", "reductions"),
        ),
        ZooModel("reductions", Reductions, lambda: (torch.randn(2, 3, 5),), ("reductions",)),
        ZooModel(
            "indexing", Indexing,
            lambda: (torch.randn(5, 6), torch.tensor([4, 1, 1, 3])),
            ("indexing", "integer"),
        ),
        ZooModel("slicing_views", SlicingViews, lambda: (torch.randn(2, 8, 8),), ("slicing",)),
        ZooModel(
            "cat_split", CatSplit, lambda: (torch.randn(4, 6), torch.randn(4, 6)),
            ("cat_split", "slicing"),
        ),
        ZooModel(
            "matmul_variants", MatmulVariants,
            lambda: (torch.randn(3, 4, 6), torch.randn(3, 6, 4)), ("mlp",),
        ),
        ZooModel(
            "gpt2_lm_head", GPT2LMHead, _gpt2_inputs,
            ("transformers", "attention", "softmax", "layer_norm", "embedding"),
            requires=("transformers",),
        ),
        ZooModel(
            "gpt2_masked", GPT2Hidden, _gpt2_masked_inputs,
            ("transformers", "attention", "softmax", "layer_norm", "embedding"),
            requires=("transformers",),
        ),
        ZooModel(
            "bert", BertEncoder, _bert_inputs,
            ("transformers", "attention", "softmax", "layer_norm", "embedding"),
            requires=("transformers",),
        ),
    ]
}

ZOO_NAMES: list[str] = list(ZOO)
