"""A blob that contradicts itself is refused at init with a typed error naming the node;
what we do not implement is refused at init too, never computed wrongly; a call
with arguments the graph cannot take fails with an InputError."""

from __future__ import annotations

import pytest
import torch

from exirc.errors import FormatError, InputError, UnsupportedOperatorError
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.graph import NodeKind as K
from tests.runtime.delegates.xnnpack.graphs import GraphBuilder

NONE = G.INVALID_VALUE_ID


def conv_graph(*, filter_dims: list[int], groups: int = 1, gin: int = 3, gout: int = 4,
               kernel: int = 3, stride: int = 1, out_dims: list[int] | None = None,
               kind: K = K.CONV2D, flags: int = 0) -> GraphBuilder:
    g = GraphBuilder()
    x = g.input([1, 5, 5, 3])
    f = g.constant(torch.zeros(filter_dims))
    out = g.output(out_dims or [1, 3, 3, 4])
    g.node(kind, G.Conv(0, 0, 0, 0, kernel, kernel, stride, stride, 1, 1, gin, gout, groups,
                        0, 0, x, f, NONE, out, flags=flags))
    return g


def refused(g: GraphBuilder, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        g.compile()


def test_a_consistent_convolution_compiles() -> None:
    conv_graph(filter_dims=[4, 3, 3, 3]).compile()


@pytest.mark.parametrize(("graph", "match"), [
    (lambda: conv_graph(filter_dims=[4, 3, 3, 2]), r"filter has dims \[4, 3, 3, 2\], "
                                                   r"expected \[4, 3, 3, 3\]"),
    (lambda: conv_graph(filter_dims=[4, 3, 3, 1], groups=2, gin=1, gout=2),
     r"input has dims \[1, 5, 5, 3\], expected \[\*, \*, \*, 2\]"),
    (lambda: conv_graph(filter_dims=[4, 0, 0, 3], kernel=0), "kernel_height is 0"),
    (lambda: conv_graph(filter_dims=[4, 3, 3, 3], stride=0), "subsampling_height is 0"),
    (lambda: conv_graph(filter_dims=[4, 3, 3, 3], out_dims=[1, 4, 4, 4]),
     r"output 2 is computed with dims \[1, 3, 3, 4\], but declares \[1, 4, 4, 4\]"),
    (lambda: conv_graph(filter_dims=[4, 3, 3, 3], kernel=3, out_dims=[1, 3, 3, 4], stride=1,
                        kind=K.CONV_TRANSPOSE2D), "adjustment|filter|dims"),
], ids=["filter", "groups", "kernel", "stride", "output dims", "deconvolution"])
def test_inconsistent_convolutions(graph: object, match: str) -> None:
    refused(graph(), FormatError, match)  # type: ignore[operator]


def test_unimplemented_flags_are_refused() -> None:
    refused(conv_graph(filter_dims=[4, 3, 3, 3], flags=0x4), UnsupportedOperatorError,
            "flags 0x4")


def unary_graph(kind: K, params: G.NodeParams, in_dims: list[int],
                out_dims: list[int]) -> GraphBuilder:
    g = GraphBuilder()
    g.input(in_dims)
    g.output(out_dims)
    g.node(kind, params)
    return g


@pytest.mark.parametrize(("kind", "params", "in_dims", "out_dims", "match"), [
    (K.STATIC_TRANSPOSE, G.StaticTranspose(3, [0, 0, 1], 0, 1), [2, 3, 4], [2, 2, 3],
     "not a permutation"),
    (K.STATIC_TRANSPOSE, G.StaticTranspose(2, [1, 0], 0, 1), [2, 3, 4], [3, 2],
     "has 3 dims"),
    (K.STATIC_RESHAPE, G.StaticReshape(2, [5, 5], 0, 1), [2, 3, 4], [5, 5],
     "does not fit"),
    (K.STATIC_RESHAPE, G.StaticReshape(2, [0, 0], 0, 1), [2, 3, 4], [4, 6],
     "more than one dim"),
    (K.STATIC_SLICE, G.StaticSlice(3, [0, 2, 0], [2, 2, 4], 0, 1), [2, 3, 4], [2, 2, 4],
     "slices"),
    (K.STATIC_CONSTANT_PAD, G.StaticConstantPad([1], [1], 0.0, 0, 1), [2, 3], [4, 3],
     "one entry per input dim"),
    (K.MAX_POOLING_2D, G.Pooling2D(0, 0, 0, 0, 0, 2, 1, 1, 1, 1, 0, 1), [1, 4, 4, 2],
     [1, 4, 3, 2], "pooling_height is 0"),
    (K.AVG_POOLING_2D, G.Pooling2D(0, 0, 0, 0, 2, 2, 1, 1, 1, 1, 0, 1), [1, 4, 4],
     [1, 3, 3], "4-D NHWC"),
    (K.SOFTMAX, G.Node1x1(0, 1), [2, 3], [2, 4], r"computed with dims \[2, 3\]"),
    (K.CLAMP, G.Node1x1(0, 1), [2, 3], [2, 3], None),
    (K.CONCATENATE2, G.Concatenate(3, 0, 0, NONE, NONE, 1), [2, 3], [2, 6],
     "axis 3"),
    (K.ELU, G.ELU(float("nan"), 0, 1), [2], [2], "alpha is nan"),
], ids=["perm", "perm rank", "reshape count", "reshape two inferred", "slice",
        "pad", "pool window", "pool rank", "softmax dims", "clamp", "concat axis", "elu nan"])
def test_inconsistent_parameters(kind: K, params: G.NodeParams, in_dims: list[int],
                                 out_dims: list[int], match: str | None) -> None:
    g = unary_graph(kind, params, in_dims, out_dims)
    if match is None:
        g.compile()
    else:
        refused(g, FormatError, match)


def test_empty_output_range_is_refused() -> None:
    g = GraphBuilder()
    a, b = g.input([2]), g.output([2])
    g.node(K.ADD, G.Node2x1(a, a, b), output_min_max=(1.0, -1.0))
    refused(g, FormatError, "empty")


def test_value_ids_are_checked() -> None:
    g = GraphBuilder()
    a, b = g.input([2]), g.output([2])
    g.node(K.ADD, G.Node2x1(a, 17, b))
    refused(g, FormatError, "value 17, which the graph does not define")


def test_values_are_read_after_they_are_written() -> None:
    g = GraphBuilder()
    a, b, c = g.input([2]), g.value([2]), g.output([2])
    g.node(K.ADD, G.Node2x1(a, b, c))
    g.node(K.ABS, G.Node1x1(a, b))
    refused(g, FormatError, "reads value 1 .* before any node writes it")


@pytest.mark.parametrize("target", ["input", "twice", "constant"])
def test_nodes_write_only_fresh_values(target: str) -> None:
    g = GraphBuilder()
    a, c = g.input([2]), g.output([2])
    w = g.constant(torch.ones(2))
    g.node(K.ABS, G.Node1x1(a, c))
    g.node(K.NEGATE, G.Node1x1(a, {"input": a, "twice": c, "constant": w}[target]))
    refused(g, FormatError, "writes value")


def test_an_output_nobody_writes_is_refused() -> None:
    g = GraphBuilder()
    g.input([2])
    g.output([2])
    refused(g, FormatError, "never written")


def test_constant_sizes_must_match_their_dims() -> None:
    g = GraphBuilder()
    a, c = g.input([3]), g.output([3])
    w = g.constant(torch.ones(3))
    g.graph.values[w].dims = [4]
    g.node(K.ADD, G.Node2x1(a, w, c))
    refused(g, FormatError, "needs 16 bytes, but its constant holds only 12")


def test_missing_named_data_is_refused() -> None:
    g = GraphBuilder()
    a, c = g.input([3]), g.output([3])
    w = g.constant(torch.ones(3), named=True)
    g.node(K.ADD, G.Node2x1(a, w, c))
    g.named.clear()
    refused(g, FormatError, "which the program does not have")


def test_values_too_large_for_memory_are_refused() -> None:
    g = GraphBuilder()
    a, big, c = g.input([2, 2]), g.value([2, 2]), g.output([2, 2])
    g.node(K.STATIC_CONSTANT_PAD, G.StaticConstantPad([0, 0], [1 << 30, 1 << 30], 0.0, a, big))
    g.node(K.STATIC_SLICE, G.StaticSlice(2, [0, 0], [2, 2], big, c))
    refused(g, FormatError, r"node 0 \(static_constant_pad\) produces .* more than the .* "
                            "bytes of memory available")


def test_declared_dims_of_internal_values_are_only_hints() -> None:
    """As in XNNPACK, shapes flow from the inputs; an internal value's declared dims
    may disagree (ExecuTorch writes some that do)."""
    g = GraphBuilder()
    a, h, c = g.input([2, 3]), g.value([3, 2]), g.output([2, 3])
    g.node(K.ABS, G.Node1x1(a, h))
    g.node(K.NEGATE, G.Node1x1(h, c))
    x = torch.randn(2, 3)
    assert torch.equal(g.run(x)[0], -x.abs())


def test_unimplemented_quantized_nodes_are_refused_naming_kind_and_datatype() -> None:
    g = GraphBuilder()
    a = g.input([4])
    q, r = g.value([4], G.Datatype.QINT8), g.value([4], G.Datatype.QINT8)
    g.graph.values[q].quant = G.PerTensorQuant(0.1, 0)
    g.graph.values[r].quant = G.PerTensorQuant(1 / 256, -128)
    c = g.output([4])
    g.node(K.CONVERT, G.Node1x1(a, q))
    g.node(K.SIGMOID, G.Node1x1(q, r))
    g.node(K.CONVERT, G.Node1x1(r, c))
    refused(g, UnsupportedOperatorError, r"node 1 \(sigmoid\).*qint8")


def test_external_ids_must_number_the_arguments() -> None:
    g = GraphBuilder()
    a, c = g.input([2]), g.output([2])
    g.node(K.ABS, G.Node1x1(a, c))
    blob = g.finish()
    blob.graph.values[c].external_id = 5
    from exirc.runtime.delegates.xnnpack.backend import XnnpackBackend
    with pytest.raises(FormatError, match="external ids"):
        XnnpackBackend().prepare(blob)


# -- at run time -----------------------------------------------------------------


def dynamic_graph() -> GraphBuilder:
    """x [2, 3] -> fully connected (3 -> 4) -> [2, 4]."""
    g = GraphBuilder()
    x, w, out = g.input([2, 3]), g.constant(torch.ones(4, 3)), g.output([2, 4])
    g.node(K.FULLY_CONNECTED, G.FullyConnected(x, w, NONE, out))
    return g


def test_a_batch_of_another_size_resizes_the_output() -> None:
    g = dynamic_graph()
    compiled = g.compile()
    out = torch.zeros(5, 4)
    execute(compiled, [torch.ones(5, 3), out])
    assert torch.equal(out, torch.full((5, 4), 3.0))


@pytest.mark.parametrize(("arg", "match"), [
    (torch.ones(2, 3, dtype=torch.float64), "dtype float64, its graph takes float32"),
    (torch.ones(6), r"rank 2"),
    (torch.ones(2, 5), "failed at node 0 \\(fully_connected\\)"),
    ([1.0], "is a list, not a tensor"),
])
def test_bad_arguments_are_input_errors(arg: object, match: str) -> None:
    compiled = dynamic_graph().compile()
    with pytest.raises(InputError, match=match):
        execute(compiled, [arg, torch.zeros(2, 4)])


def test_argument_count_is_checked() -> None:
    compiled = dynamic_graph().compile()
    with pytest.raises(InputError, match="takes 2 arguments"):
        execute(compiled, [torch.ones(2, 3)])


def test_slices_never_come_out_short() -> None:
    g = GraphBuilder()
    a, c = g.input([4, 3]), g.output([2, 3])
    g.node(K.STATIC_SLICE, G.StaticSlice(2, [2, 0], [2, 3], a, c))
    compiled = g.compile()
    with pytest.raises(InputError, match="static_slice"):
        execute(compiled, [torch.ones(3, 3), torch.zeros(2, 3)])
