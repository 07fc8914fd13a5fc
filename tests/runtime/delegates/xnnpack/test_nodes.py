"""Each XNNPACK node kind, built by hand, against a torch reference written in torch's
own layouts (NCHW, `[O, I/groups, KH, KW]` filters), so that the layout
conversions are tested, not repeated."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.graph import NodeKind as K
from tests.runtime.delegates.xnnpack.graphs import GraphBuilder

RTOL, ATOL = 1e-5, 1e-5
NONE = G.INVALID_VALUE_ID


def close(ours: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=ATOL)


def nhwc(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 2, 3, 1).contiguous()


def nchw(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 3, 1, 2)


UNARY: dict[K, Callable[[torch.Tensor], torch.Tensor]] = {
    K.ABS: torch.abs, K.CEILING: torch.ceil, K.FLOOR: torch.floor, K.NEGATE: torch.neg,
    K.SQUARE: lambda x: x * x, K.SQUARE_ROOT: torch.sqrt,
    K.RECIPROCAL_SQUARE_ROOT: lambda x: 1 / torch.sqrt(x), K.LOG: torch.log,
    K.EXP: torch.exp, K.SIN: torch.sin,
    K.COS: torch.cos, K.TANH: torch.tanh, K.SIGMOID: torch.sigmoid,
    K.GELU: lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5)),
    K.HARDSWISH: lambda x: x * torch.clamp(x + 3, 0, 6) / 6,
    K.SOFTMAX: lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
    K.COPY: lambda x: x, K.CONVERT: lambda x: x,
}
# Inputs in each function's domain.
DOMAIN = {K.SQUARE_ROOT: torch.abs, K.RECIPROCAL_SQUARE_ROOT: lambda x: x.abs() + 0.5,
          K.LOG: lambda x: x.abs() + 0.1}


@pytest.mark.parametrize("kind", list(UNARY), ids=lambda k: k.name.lower())
def test_unary(kind: K) -> None:
    x = torch.randn(2, 3, 5) * 3
    x = DOMAIN.get(kind, lambda t: t)(x)
    g = GraphBuilder()
    a, out = g.input([2, 3, 5]), g.output([2, 3, 5])
    g.node(kind, G.Node1x1(a, out))
    close(g.run(x)[0], UNARY[kind](x))


def test_clamp_elu_leaky_relu() -> None:
    x = torch.randn(4, 6) * 4
    g = GraphBuilder()
    a = g.input([4, 6])
    c, e, lr = g.output([4, 6]), g.output([4, 6]), g.output([4, 6])
    g.node(K.CLAMP, G.Node1x1(a, c), output_min_max=(-1.0, 2.5))
    g.node(K.ELU, G.ELU(0.7, a, e))
    g.node(K.LEAKY_RELU, G.LeakyReLU(0.05, a, lr))
    ours = g.run(x)
    close(ours[0], x.clamp(-1.0, 2.5))
    close(ours[1], torch.where(x > 0, x, 0.7 * (torch.exp(x) - 1)))
    close(ours[2], torch.where(x > 0, x, 0.05 * x))


BINARY = {K.ADD: torch.add, K.SUBTRACT: torch.sub, K.MULTIPLY: torch.mul, K.DIV: torch.div,
          K.MINIMUM: torch.minimum, K.MAXIMUM: torch.maximum}


@pytest.mark.parametrize("kind", list(BINARY), ids=lambda k: k.name.lower())
def test_binary_broadcasts_and_clamps(kind: K) -> None:
    x, y = torch.randn(2, 3, 4), torch.randn(3, 1) + 2.5
    g = GraphBuilder()
    a, b = g.input([2, 3, 4]), g.input([3, 1])
    plain, fused = g.output([2, 3, 4]), g.output([2, 3, 4])
    g.node(kind, G.Node2x1(a, b, plain))
    g.node(kind, G.Node2x1(a, b, fused), output_min_max=(0.0, 1.5))
    ours = g.run(x, y)
    expected = BINARY[kind](x, y)
    close(ours[0], expected)
    # Only the kinds ExecuTorch's runtime clamps honour output_min_max.
    clamps = kind in (K.ADD, K.SUBTRACT, K.MULTIPLY, K.DIV)
    close(ours[1], expected.clamp(0.0, 1.5) if clamps else expected)


def test_binary_with_constant_operand_from_named_data() -> None:
    x, w = torch.randn(3, 4), torch.randn(4)
    g = GraphBuilder()
    a, b, out = g.input([3, 4]), g.constant(w, named=True), g.output([3, 4])
    g.node(K.MULTIPLY, G.Node2x1(a, b, out))
    close(g.run(x)[0], x * w)


def test_prelu_slope_along_channels() -> None:
    x, slope = torch.randn(1, 4, 4, 3), torch.tensor([0.1, 0.5, 2.0])
    g = GraphBuilder()
    a, s, out = g.input([1, 4, 4, 3]), g.constant(slope), g.output([1, 4, 4, 3])
    g.node(K.PRELU, G.Node2x1(a, s, out))
    close(g.run(x)[0], nhwc(F.prelu(nchw(x), slope)))


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_fully_connected(transposed: bool, bias: bool) -> None:
    x, w, b = torch.randn(2, 5, 6), torch.randn(4, 6), torch.randn(4)
    g = GraphBuilder()
    a = g.input([2, 5, 6])
    f = g.constant(w.t().contiguous() if transposed else w)
    bias_id = g.constant(b) if bias else NONE
    out = g.output([2, 5, 4])
    g.node(K.FULLY_CONNECTED, G.FullyConnected(a, f, bias_id, out, flags=int(transposed)),
           output_min_max=(0.0, float("inf")))
    close(g.run(x)[0], F.relu(F.linear(x, w, b if bias else None)))


def test_fully_connected_with_a_filter_computed_at_run_time() -> None:
    x, w = torch.randn(3, 6), torch.randn(6, 2)
    g = GraphBuilder()
    a, f, out = g.input([3, 6]), g.input([6, 2]), g.output([3, 2])
    g.node(K.FULLY_CONNECTED, G.FullyConnected(a, f, NONE, out, flags=1))
    close(g.run(x, w)[0], x @ w)


def conv(kind: K, *, k: tuple[int, int], stride: tuple[int, int] = (1, 1),
         dilation: tuple[int, int] = (1, 1), pad: tuple[int, int, int, int] = (0, 0, 0, 0),
         groups: int = 1, gin: int, gout: int, x: int, f: int, b: int, out: int,
         adjustment: tuple[int, int] = (0, 0)) -> G.Conv:
    return G.Conv(*pad, *k, *stride, *dilation, gin, gout, groups, *adjustment, x, f, b, out)


@pytest.mark.parametrize("groups", [1, 2])
def test_convolution(groups: int) -> None:
    x = torch.randn(2, 4, 9, 8)
    w, b = torch.randn(6, 4 // groups, 3, 2), torch.randn(6)
    expected = F.relu6(F.conv2d(x, w, b, stride=(2, 1), padding=(1, 1), dilation=(1, 2),
                                groups=groups))
    g = GraphBuilder()
    a = g.input([2, 9, 8, 4])
    fid, bid = g.constant(nhwc(w)), g.constant(b)
    out = g.output(list(nhwc(expected).shape))
    g.node(K.CONV2D, conv(K.CONV2D, k=(3, 2), stride=(2, 1), dilation=(1, 2), pad=(1, 1, 1, 1),
                          groups=groups, gin=4 // groups, gout=6 // groups, x=a, f=fid, b=bid,
                          out=out), output_min_max=(0.0, 6.0))
    close(g.run(nhwc(x))[0], nhwc(expected))


def test_convolution_with_asymmetric_padding() -> None:
    x, w = torch.randn(1, 3, 6, 6), torch.randn(5, 3, 3, 3)
    expected = F.conv2d(F.pad(x, (0, 2, 1, 0)), w)  # left 0, right 2, top 1, bottom 0
    g = GraphBuilder()
    a, fid = g.input([1, 6, 6, 3]), g.constant(nhwc(w))
    out = g.output(list(nhwc(expected).shape))
    g.node(K.CONV2D, conv(K.CONV2D, k=(3, 3), pad=(1, 2, 0, 0), gin=3, gout=5, x=a, f=fid,
                          b=NONE, out=out))
    close(g.run(nhwc(x))[0], nhwc(expected))


@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_convolution(multiplier: int) -> None:
    x = torch.randn(1, 3, 7, 7)
    w, b = torch.randn(3 * multiplier, 1, 3, 3), torch.randn(3 * multiplier)
    expected = F.conv2d(x, w, b, stride=2, padding=1, groups=3)
    g = GraphBuilder()
    a = g.input([1, 7, 7, 3])
    fid, bid = g.constant(w.permute(1, 2, 3, 0).contiguous()), g.constant(b)  # [1, KH, KW, O]
    out = g.output(list(nhwc(expected).shape))
    g.node(K.DEPTHWISE_CONV2D, conv(K.DEPTHWISE_CONV2D, k=(3, 3), stride=(2, 2),
                                    pad=(1, 1, 1, 1), groups=3, gin=1, gout=multiplier, x=a,
                                    f=fid, b=bid, out=out))
    close(g.run(nhwc(x))[0], nhwc(expected))


@pytest.mark.parametrize(("groups", "pad", "adjustment"),
                         [(1, (1, 1, 1, 1), (1, 1)), (2, (0, 0, 0, 0), (0, 1)),
                          (1, (1, 0, 2, 1), (1, 0))])
def test_deconvolution(groups: int, pad: tuple[int, int, int, int],
                       adjustment: tuple[int, int]) -> None:
    x = torch.randn(1, 4, 5, 5)
    w, b = torch.randn(4, 6 // groups, 3, 3), torch.randn(6)  # torch: [I, O/groups, KH, KW]
    top, right, bottom, left = pad
    full = F.conv_transpose2d(x, w, b, stride=2, output_padding=adjustment, groups=groups)
    expected = full[:, :, top:full.shape[2] - bottom, left:full.shape[3] - right]
    # XNNPACK's filter: [G*Og, KH, KW, Ig]
    gin, gout = 4 // groups, 6 // groups
    f = w.reshape(groups, gin, gout, 3, 3).transpose(1, 2).reshape(6, gin, 3, 3)
    g = GraphBuilder()
    a, fid, bid = g.input([1, 5, 5, 4]), g.constant(nhwc(f)), g.constant(b)
    out = g.output(list(nhwc(expected).shape))
    g.node(K.CONV_TRANSPOSE2D, conv(K.CONV_TRANSPOSE2D, k=(3, 3), stride=(2, 2), pad=pad,
                                    groups=groups, gin=gin, gout=gout, x=a, f=fid, b=bid,
                                    out=out, adjustment=adjustment))
    close(g.run(nhwc(x))[0], nhwc(expected))


@pytest.mark.parametrize("transpose_b", [False, True])
def test_batch_matrix_multiply_broadcasts(transpose_b: bool) -> None:
    x, y = torch.randn(2, 3, 4, 5), torch.randn(3, 5, 6)
    g = GraphBuilder()
    a = g.input([2, 3, 4, 5])
    b = g.input([3, 6, 5] if transpose_b else [3, 5, 6])
    out = g.output([2, 3, 4, 6])
    g.node(K.BATCH_MATRIX_MULTIPLY, G.Node2x1(a, b, out, flags=int(transpose_b)))
    operand = y.transpose(-1, -2).contiguous() if transpose_b else y
    close(g.run(x, operand)[0], torch.matmul(x, y))


def pool(kind: K, k: tuple[int, int], stride: tuple[int, int],
         pad: tuple[int, int, int, int], x: int, out: int,
         dilation: tuple[int, int] = (1, 1)) -> G.Pooling2D:
    return G.Pooling2D(*pad, *k, *stride, *dilation, x, out, flags=0x40)


@pytest.mark.parametrize("pad", [(0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 2, 1)])
def test_max_and_average_pooling(pad: tuple[int, int, int, int]) -> None:
    x = torch.randn(2, 3, 8, 7)
    top, right, bottom, left = pad
    padded_max = F.pad(x, (left, right, top, bottom), value=float("-inf"))
    expected_max = F.max_pool2d(padded_max, 3, 2)
    total = F.avg_pool2d(F.pad(x, (left, right, top, bottom)), 3, 2, divisor_override=1)
    count = F.avg_pool2d(F.pad(torch.ones(1, 1, 8, 7), (left, right, top, bottom)), 3, 2,
                         divisor_override=1)
    expected_avg = total / count
    g = GraphBuilder()
    a = g.input([2, 8, 7, 3])
    m, v = g.output(list(nhwc(expected_max).shape)), g.output(list(nhwc(expected_avg).shape))
    g.node(K.MAX_POOLING_2D, pool(K.MAX_POOLING_2D, (3, 3), (2, 2), pad, a, m))
    g.node(K.AVG_POOLING_2D, pool(K.AVG_POOLING_2D, (3, 3), (2, 2), pad, a, v),
           output_min_max=(-0.5, 0.5))
    ours = g.run(nhwc(x))
    close(ours[0], nhwc(expected_max))
    close(ours[1], nhwc(expected_avg).clamp(-0.5, 0.5))


def test_dilated_max_pooling() -> None:
    x = torch.randn(1, 2, 9, 9)
    expected = F.max_pool2d(x, 2, 1, dilation=2)
    g = GraphBuilder()
    a, out = g.input([1, 9, 9, 2]), g.output(list(nhwc(expected).shape))
    g.node(K.MAX_POOLING_2D, pool(K.MAX_POOLING_2D, (2, 2), (1, 1), (0, 0, 0, 0), a, out,
                                  dilation=(2, 2)))
    close(g.run(nhwc(x))[0], nhwc(expected))


@pytest.mark.parametrize("keep", [True, False])
def test_global_average_pooling(keep: bool) -> None:
    x = torch.randn(2, 5, 4, 3)
    g = GraphBuilder()
    a, out = g.input([2, 5, 4, 3]), g.output([2, 1, 1, 3] if keep else [2, 3])
    g.node(K.GLOBAL_AVG_POOLING_2D, G.Node1x1(a, out, flags=0x40 if keep else 0))
    close(g.run(x)[0], x.mean((1, 2), keepdim=keep))


def argmax_reference(x: torch.Tensor, ph: int, pw: int, pad: tuple[int, int, int, int]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """XNNPACK's reference loop, transcribed: the first real element starts, a strictly
    greater one replaces it, indices count x * ph + y."""
    top, right, bottom, left = pad
    n, h, w, c = x.shape
    oh, ow = (h + top + bottom) // ph, (w + left + right) // pw
    values = torch.empty(n, oh, ow, c)
    indices = torch.empty(n, oh, ow, c, dtype=torch.int32)
    for i in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    iy0 = max(oy * ph, top) - top
                    ix0 = max(ox * pw, left) - left
                    best, index = x[i, iy0, ix0, ch].item(), 0
                    for py in range(ph):
                        for px in range(pw):
                            iy, ix = oy * ph + py - top, ox * pw + px - left
                            if 0 <= iy < h and 0 <= ix < w and x[i, iy, ix, ch] > best:
                                best, index = x[i, iy, ix, ch].item(), px * ph + py
                    values[i, oy, ox, ch], indices[i, oy, ox, ch] = best, index
    return values, indices


@pytest.mark.parametrize("pad", [(0, 0, 0, 0), (1, 0, 0, 1)])
def test_argmax_pooling(pad: tuple[int, int, int, int]) -> None:
    x = torch.randn(1, 5, 6, 2)
    expected_values, expected_indices = argmax_reference(x, 2, 3, pad)
    g = GraphBuilder()
    a = g.input([1, 5, 6, 2])
    v = g.output(list(expected_values.shape))
    i = g.output(list(expected_indices.shape), G.Datatype.INT32)
    g.node(K.ARG_MAX_POOLING_2D, G.ArgMaxPooling2d(*pad, 2, 3, a, v, i))
    values, indices = g.run(x)
    close(values, expected_values)
    assert torch.equal(indices, expected_indices)


@pytest.mark.parametrize("align", [False, True])
def test_resize_bilinear(align: bool) -> None:
    x = torch.randn(1, 3, 5, 4)
    expected = F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=align)
    g = GraphBuilder()
    a, out = g.input([1, 5, 4, 3]), g.output([1, 9, 7, 3])
    g.node(K.STATIC_RESIZE_BILINEAR_2D, G.StaticResizeBilinear2D(9, 7, a, out,
                                                                  flags=8 if align else 0))
    close(g.run(nhwc(x))[0], nhwc(expected))


@pytest.mark.smoke
def test_data_movement() -> None:
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 2)
    g = GraphBuilder()
    a, b = g.input([2, 3, 4]), g.input([2, 3, 2])
    t = g.output([4, 2, 3])
    r = g.output([3, 8])
    s = g.output([1, 2, 3])
    p = g.output([3, 4, 3])
    c = g.output([2, 3, 6])
    g.node(K.STATIC_TRANSPOSE, G.StaticTranspose(3, [2, 0, 1], a, t))
    g.node(K.STATIC_RESHAPE, G.StaticReshape(2, [3, 0], a, r))
    g.node(K.STATIC_SLICE, G.StaticSlice(3, [1, 0, 1], [1, 2, 3], a, s))
    g.node(K.STATIC_CONSTANT_PAD, G.StaticConstantPad([0, 1, 0], [1, 0, 1], -2.0, b, p))
    g.node(K.CONCATENATE2, G.Concatenate(2, a, b, NONE, NONE, c))
    ours = g.run(x, y)
    close(ours[0], x.permute(2, 0, 1))
    close(ours[1], x.reshape(3, 8))
    close(ours[2], x[1:2, 0:2, 1:4])
    close(ours[3], F.pad(y, (0, 1, 1, 0, 0, 1), value=-2.0))
    close(ours[4], torch.cat([x, y], 2))


@pytest.mark.parametrize("count", [3, 4, 5])
def test_concatenate_many(count: int) -> None:
    xs = [torch.randn(2, i + 1) for i in range(count)]
    g = GraphBuilder()
    ids = [g.input([2, i + 1]) for i in range(count)]
    out = g.output([2, sum(range(1, count + 1))])
    ids += [NONE] * (5 - count)
    kind = {3: K.CONCATENATE3, 4: K.CONCATENATE4, 5: K.CONCATENATE5}[count]
    g.node(kind, G.Concatenate(1, ids[0], ids[1], ids[2], ids[3], out, input5_id=ids[4]))
    close(g.run(*xs)[0], torch.cat(xs, 1))


@pytest.mark.parametrize("multi_query", [False, True])
def test_scaled_dot_product_attention(multi_query: bool) -> None:
    q = torch.randn(2, 3, 4, 8)
    k = torch.randn(2, 5, 8) if multi_query else torch.randn(2, 3, 5, 8)
    v = torch.randn(2, 5, 6) if multi_query else torch.randn(2, 3, 5, 6)
    scale, mask = torch.full((8,), 8 ** -0.5), torch.randn(4, 5)
    keys = k.unsqueeze(1) if multi_query else k
    values = v.unsqueeze(1) if multi_query else v
    expected = F.scaled_dot_product_attention(q, keys.expand(2, 3, 5, 8),
                                              values.expand(2, 3, 5, 6), attn_mask=mask)
    g = GraphBuilder()
    qi, ki, vi = g.input(list(q.shape)), g.input(list(k.shape)), g.input(list(v.shape))
    si, mi, out = g.constant(scale), g.constant(mask), g.output([2, 3, 4, 6])
    g.node(K.SCALED_DOT_PRODUCT_ATTENTION, G.ScaledDotProductAttention(qi, ki, vi, si, mi, out))
    close(g.run(q, k, v)[0], expected)


def test_fp16_values_compute_in_float32_and_round_once() -> None:
    """An fp16 graph with fp32 weights (as ExecuTorch writes convolutions): each node
    computes in float32 and rounds its output to fp16."""
    x, w, b = torch.randn(3, 8).half(), torch.randn(4, 8), torch.randn(4)
    g = GraphBuilder()
    a = g.input([3, 8], G.Datatype.FP16)
    f, bias = g.constant(w), g.constant(b.half())
    h = g.value([3, 4], G.Datatype.FP16)
    out = g.output([3, 4], G.Datatype.FP16)
    g.node(K.FULLY_CONNECTED, G.FullyConnected(a, f, bias, h))
    g.node(K.SIGMOID, G.Node1x1(h, out))
    hidden = F.linear(x.float(), w, b.half().float()).half()
    expected = torch.sigmoid(hidden.float()).half()
    ours = g.run(x)[0]
    assert ours.dtype == torch.float16
    assert torch.equal(ours, expected)


def test_convert_between_float_types() -> None:
    x = torch.randn(5) * 100
    g = GraphBuilder()
    a, h, out = g.input([5]), g.value([5], G.Datatype.FP16), g.output([5])
    g.node(K.CONVERT, G.Node1x1(a, h))
    g.node(K.CONVERT, G.Node1x1(h, out))
    assert torch.equal(g.run(x)[0], x.half().float())
