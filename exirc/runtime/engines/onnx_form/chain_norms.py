"""Normalisations, reductions and splits as ONNX nodes in a fused chain (`onnx_chain`).

ExecuTorch's XNNPACK partitioner leaves some of a model's ops to portable
kernels between its delegates: every LayerNorm of a transformer
(`native_layer_norm`, whose three outs the chain writes at once), a global
average pool written as `mean` over H and W, the gate split of an LSTM cell
(`split_with_sizes_copy`, whose out is a list). Each kept the whole method
kernel by kernel, at 5-12x ExecuTorch's own time for the same file.

Exactness: Split only moves elements. LayerNormalization, ReduceMean,
float ReduceSum and MatMul (mm and bmm between delegates, as Falcon's
ExecuTorch file has) sum in onnxruntime's order, not torch's (as the delegates
around them already do; within the verify tolerances, and LayerNormalization
stays as close to a float64 reference as torch's kernel on inputs whose mean
dwarfs their spread); integer ReduceSum is exact. Anything the kernel would
refuse or compute otherwise (empty reductions, a dtype argument, unlike
dtypes, zero-sized splits) raises `NotMapped`.
"""

from __future__ import annotations

import numpy
import torch

from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.chain_moves import meta_result
from exirc.runtime.engines.onnx_form.chain_ops import (
    INTEGER_DTYPES,
    ONNX_TYPES,
    Emitter,
    Translator,
    same_shape,
)


def _int_list(value: object) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                       for v in value):
        return value
    return None


def _optional_tensor(e: Emitter, value: int, shape: list[int]) -> str | None:
    """A float32 tensor argument of `shape` by name, None for None, else NotMapped."""
    try:
        tensor = e.tensor(value)
    except NotMapped:
        if e.scalar(value) is None:
            return None
        raise
    if tensor.dtype != torch.float32 or list(tensor.shape) != shape:
        raise NotMapped(f"a weight of {tensor.dtype}{list(tensor.shape)}, not float32{shape}")
    return e.name(value)


def native_layer_norm(e: Emitter, args: list[int]) -> None:
    """`native_layer_norm.out(x, normalized_shape, weight?, bias?, eps, out, mean, rstd)`:
    one LayerNormalization node writing all three (its Mean and InvStdDev are torch's
    mean and rstd, of the same shape)."""
    source = e.tensor(args[0])
    shape, eps = _int_list(e.scalar(args[1])), e.scalar(args[4])
    out, mean, rstd = args[5:8]
    if source.dtype != torch.float32 or not shape or len(shape) > source.dim() or \
            list(source.shape[source.dim() - len(shape):]) != shape or source.numel() == 0 or \
            not isinstance(eps, float):
        raise NotMapped(f"a layer norm over {shape!r} of {source.dtype}{list(source.shape)}")
    axis = source.dim() - len(shape)
    statistics = (*source.shape[:axis], *[1] * len(shape))
    for value, expected in ((out, tuple(source.shape)), (mean, statistics), (rstd, statistics)):
        if e.tensor(value).dtype != torch.float32:
            raise NotMapped(f"an out of {e.tensor(value).dtype}")
        same_shape(e, value, expected)
    scale = _optional_tensor(e, args[2], shape) or \
        e.array("ones", numpy.ones(shape, numpy.float32))
    bias = _optional_tensor(e, args[3], shape)
    e.node("LayerNormalization", [e.name(args[0]), scale, *([bias] if bias else [])],
           [e.name(out), e.name(mean), e.name(rstd)], axis=axis, epsilon=eps)


def _reduction(op_type: str, torch_op: object) -> Translator:
    """`mean.out` / `sum.IntList_out(x, dims?, keepdim, dtype=None)` over float32 (and,
    for sums, integers and bools, which torch adds up in int64)."""

    def translate(e: Emitter, args: list[int]) -> None:
        source, out = e.tensor(args[0]), args[-1]
        dims, keepdim, dtype = e.scalar(args[1]), e.scalar(args[2]), e.scalar(args[3])
        summed = op_type == "ReduceSum"
        counted = summed and (source.dtype in INTEGER_DTYPES or source.dtype == torch.bool)
        wanted = torch.int64 if counted else torch.float32
        if dtype is not None or not isinstance(keepdim, bool) or source.numel() == 0 or \
                not (source.dtype == torch.float32 or counted) or \
                e.tensor(out).dtype != wanted or (dims is not None and _int_list(dims) is None):
            raise NotMapped(f"a {op_type} over {dims!r} of {source.dtype} into "
                            f"{e.tensor(out).dtype} (dtype={dtype!r})")
        same_shape(e, out, meta_result(e, torch_op, args[0], dims, keepdim))
        rank = source.dim()
        axes = sorted({d % rank for d in dims}) if dims and rank else list(range(rank))
        name = e.name(args[0])
        if counted and source.dtype != torch.int64:
            name = e.node("Cast", [name], to=ONNX_TYPES[torch.int64])
        inputs = [name, e.array("axes", numpy.asarray(axes, numpy.int64))] if axes else [name]
        e.node(op_type, inputs, [e.name(out)], keepdims=int(keepdim))
    return translate


def matmul(e: Emitter, args: list[int]) -> None:
    """`mm.out` / `bmm.out` of float32 (a product ExecuTorch's partitioner left between
    delegates, both operands computed): MatMul, summing in onnxruntime's order."""
    first, second, out = (e.tensor(v) for v in (args[0], args[1], args[-1]))
    if not first.dtype == second.dtype == out.dtype == torch.float32 or \
            first.dim() != second.dim() or first.dim() not in (2, 3):
        raise NotMapped(f"a product of {first.dtype}{list(first.shape)} and "
                        f"{second.dtype}{list(second.shape)}")
    same_shape(e, args[-1], meta_result(e, torch.matmul, args[0],
                                         torch.empty(second.shape, device="meta")))
    e.node("MatMul", [e.name(args[0]), e.name(args[1])], [e.name(args[-1])])


def split_with_sizes(e: Emitter, args: list[int]) -> None:
    """`split_with_sizes_copy.out(x, sizes, dim, out=[...])`: one Split into the list's tensors."""
    source, items = e.tensor(args[0]), e.items(args[3])
    sizes, dim = _int_list(e.scalar(args[1])), e.scalar(args[2])
    rank = source.dim()
    if not sizes or not items or None in items or len(items) != len(sizes) or \
            not isinstance(dim, int) or not -rank <= dim < rank or min(sizes) <= 0 or \
            sum(sizes) != source.shape[dim]:
        raise NotMapped(f"a split into {sizes!r} along {dim!r} of {list(source.shape)}")
    axis = dim % rank
    names = []
    for size, item in zip(sizes, items):
        assert item is not None
        if e.tensor(item).dtype != source.dtype:
            raise NotMapped(f"a split of {source.dtype} into {e.tensor(item).dtype}")
        same_shape(e, item, (*source.shape[:axis], size, *source.shape[axis + 1:]))
        names.append(e.name(item))
    e.node("Split", [e.name(args[0]), e.array("split", numpy.asarray(sizes, numpy.int64))],
           names, axis=axis)


NORMS: dict[str, Translator] = {
    "aten::native_layer_norm.out": native_layer_norm,
    "aten::mean.out": _reduction("ReduceMean", torch.mean),
    "aten::sum.IntList_out": _reduction("ReduceSum", torch.sum),
    "aten::split_with_sizes_copy.out": split_with_sizes,
    "aten::mm.out": matmul,
    "aten::bmm.out": matmul,
}
