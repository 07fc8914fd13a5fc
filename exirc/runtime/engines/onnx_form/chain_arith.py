"""More ATen kernels a fused chain (`onnx_chain`) can express as ONNX nodes:
broadcasts, integer arithmetic, position ids, a log-softmax head.

Transformers models compute around their delegates what XNNPACK has no node
for: an all-true attention mask expanded to [B, 1, T, T] (ViT, DeiT and
wav2vec2 under transformers 5), position ids from a padding mask (RoBERTa's
`cumsum(mask) * mask + padding_idx`, OPT's), a `log_softmax` head after the
last delegate. Each would keep the whole method kernel by kernel. As in
`onnx_chain_ops`, each translator emits nodes computing what the kernel
computes for the argument kinds it can prove that of, and raises `NotMapped`
for anything else:

- expand_copy: Expand to the output's shape, once torch's own rules say the
  sizes give that shape (ONNX broadcasts both ways; torch refuses where a
  size of 1 asks to shrink a dim). A copy: exact.
- add/sub/mul and their scalar forms with alpha 1, into float32 or an integer
  dtype (of mixed dtypes too: each operand cast to the dtype torch's promotion
  picks, as torch casts it, e.g. an int64 or float64 0-d constant added to a
  float32 tensor, a bool mask times int64 ids): Add/Sub/Mul. Integers wrap
  around as torch's do; casts to float32 round to nearest in both; a float32
  sum or product is one IEEE operation either way.
- minimum/maximum of integer tensors of one dtype: Min/Max (exact; floats are
  refused, NaN handling differs).
- pow of float32 by 2, 3, -1 or -2: the products and reciprocal torch's
  kernel computes, in its order; other exponents are refused.
- comparisons (eq/ne/ge/gt/le/lt of a tensor with a scalar of its kind or with
  a tensor of its dtype) without promotion: Equal, Greater, Less, ..., exact.
- cumsum of an integer tensor in its own dtype or in int64 (torch's default
  for integers and bools): a Cast to int64 where needed, and CumSum; exact (sums of
  integers do not depend on their order).
- arange with constant bounds: its values, computed by torch at load, as a
  constant (the kernel would compute the same numbers every run).
- gather: GatherElements (over a Slice of the source where the index spans
  less of a dim); ONNX wraps negative indices where torch raises, so the
  index joins the chain's least-index output, as an embedding's does.
- ExecuTorch's dim-order copies (_to_dim_order_copy, _clone_dim_order) into
  a contiguous out: Identity, or to_copy's Cast when the dtype changes.
- _log_softmax of float32 over one dim: LogSoftmax. Not bit for bit:
  onnxruntime sums the exponentials in another order, as every delegate node
  does (within the verify tolerances, as they are).
"""

from __future__ import annotations

import numpy
import torch

from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.chain_ops import (
    INTEGER_DTYPES,
    ONNX_TYPES,
    Emitter,
    Translator,
    broadcast,
    same_shape,
    scalar_of_kind,
    to_copy,
)


def expand_copy(e: Emitter, args: list[int]) -> None:
    source, out = e.tensor(args[0]), args[-1]
    sizes = e.scalar(args[1])
    if not isinstance(sizes, list) or not all(isinstance(s, int) for s in sizes) or \
            e.tensor(out).dtype != source.dtype:
        raise NotMapped(f"an expand to {sizes!r}")
    try:
        shape = tuple(source.expand(sizes).shape)  # torch's rules, on the planned tensor's meta
    except RuntimeError:
        raise NotMapped(f"{tuple(source.shape)} does not expand to {sizes!r}") from None
    same_shape(e, out, shape)
    e.node("Expand", [e.name(args[0]), e.array("shape", numpy.asarray(shape, numpy.int64))],
           [e.name(out)])


def _arithmetic_operands(e: Emitter, args: list[int], alpha_at: int | None,
                      scalar: bool) -> tuple[str, str]:
    """The two operand names of an add/sub/mul, checked (module docstring)."""
    first, out = e.tensor(args[0]), e.tensor(args[-1])
    if alpha_at is not None and e.scalar(args[alpha_at]) != 1:
        raise NotMapped("an alpha other than 1")
    if scalar:
        if first.dtype not in (*INTEGER_DTYPES, torch.float32) or out.dtype != first.dtype:
            raise NotMapped(f"arithmetic on {first.dtype} into {out.dtype}")
        same_shape(e, args[-1], first.shape)
        return e.name(args[0]), e.array("scalar", scalar_of_kind(e, first, e.scalar(args[1])))
    second = e.tensor(args[1])
    kind = torch.result_type(first, second)  # torch's promotion, 0-d operands' rule included
    castable = {*INTEGER_DTYPES, torch.bool} if kind in INTEGER_DTYPES else \
        {*INTEGER_DTYPES, torch.bool, torch.float32, torch.float64}
    if out.dtype != kind or kind not in (*INTEGER_DTYPES, torch.float32) or \
            not {first.dtype, second.dtype} <= castable:
        raise NotMapped(f"{first.dtype} with {second.dtype} into {out.dtype}")
    same_shape(e, args[-1], broadcast(first, second))
    # Operands are cast to the common dtype first, as torch casts them: integers in
    # two's complement, to float32 rounded to nearest (x + an int64 0-d constant).
    names = [e.name(v) if e.tensor(v).dtype == kind else
             e.node("Cast", [e.name(v)], to=ONNX_TYPES[kind]) for v in args[:2]]
    return names[0], names[1]


def _arithmetic(op_type: str, alpha_at: int | None, scalar: bool) -> Translator:
    def translate(e: Emitter, args: list[int]) -> None:
        e.node(op_type, list(_arithmetic_operands(e, args, alpha_at, scalar)), [e.name(args[-1])])
    return translate


def _comparison(op_type: str, scalar: bool) -> Translator:
    """eq/ne/ge/gt/le/lt of a tensor with a scalar of its kind or a tensor of its
    dtype (no promotion); "NotEqual" is Not(Equal), as NaN != NaN is in torch."""

    def translate(e: Emitter, args: list[int]) -> None:
        first, out = e.tensor(args[0]), args[-1]
        if e.tensor(out).dtype != torch.bool or \
                (first.dtype == torch.bool and op_type not in ("Equal", "NotEqual")):
            raise NotMapped(f"a comparison of {first.dtype} into {e.tensor(out).dtype}")
        if scalar:
            second = e.array("scalar", scalar_of_kind(e, first, e.scalar(args[1])))
            same_shape(e, out, first.shape)
        else:
            if e.tensor(args[1]).dtype != first.dtype:
                raise NotMapped(f"{first.dtype} with {e.tensor(args[1]).dtype} is promoted")
            second = e.name(args[1])
            same_shape(e, out, broadcast(first, e.tensor(args[1])))
        if op_type == "NotEqual":
            e.node("Not", [e.node("Equal", [e.name(args[0]), second])], [e.name(out)])
        else:
            e.node(op_type, [e.name(args[0]), second], [e.name(out)])
    return translate


def cumsum(e: Emitter, args: list[int]) -> None:
    source, out = e.tensor(args[0]), args[-1]
    dim, dtype = e.scalar(args[1]), e.scalar(args[2])
    rank, dims = source.dim(), max(source.dim(), 1)  # a 0-d tensor takes dim 0 or -1
    target = e.tensor(out).dtype
    counted = source.dtype == torch.bool and target == torch.int64  # a count of trues
    if (source.dtype not in INTEGER_DTYPES and not counted) or \
            target not in (source.dtype, torch.int64) or dtype is not None or \
            not isinstance(dim, int) or not -dims <= dim < dims:
        raise NotMapped(f"a cumsum of {source.dtype} into {target} over {dim!r}")
    same_shape(e, out, source.shape)
    values = e.name(args[0])
    if target != source.dtype:  # torch sums in the out's dtype (int64 for any integer or bool)
        values = e.node("Cast", [values], to=ONNX_TYPES[target])
    if rank == 0:
        e.node("Identity", [values], [e.name(out)])
        return
    e.node("CumSum", [values, e.array("axis", numpy.asarray(dim % rank, numpy.int64))],
           [e.name(out)])


def arange(e: Emitter, args: list[int]) -> None:
    out = e.tensor(args[-1])
    bounds = [e.scalar(v) for v in args[:-1]]
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
        raise NotMapped(f"arange bounds {bounds!r}")
    try:  # the kernel itself, into a tensor of the out's dtype
        values = torch.arange(*bounds, out=torch.empty(0, dtype=out.dtype))
    except RuntimeError:
        raise NotMapped(f"arange{tuple(bounds)!r} fails") from None
    same_shape(e, args[-1], values.shape)
    e.node("Identity", [e.array("arange", values.numpy())], [e.name(args[-1])])


def gather(e: Emitter, args: list[int]) -> None:
    """torch.gather: GatherElements over the part of the source the index spans
    (torch reads only its first index.size(d) rows in every other dim d)."""
    source, index, out = e.tensor(args[0]), e.tensor(args[2]), args[-1]
    dim, rank = e.scalar(args[1]), source.dim()
    if index.dtype != torch.int64 or rank == 0 or index.dim() != rank or \
            not isinstance(dim, int) or not -rank <= dim < rank or index.numel() == 0 or \
            e.tensor(out).dtype != source.dtype:
        raise NotMapped("not a gather ONNX's GatherElements computes")
    axis = dim % rank
    if any(index.shape[d] > source.shape[d] for d in range(rank) if d != axis):
        raise NotMapped("its index spans more of a dim than the source has (torch refuses)")
    same_shape(e, out, index.shape)
    data = e.name(args[0])
    cut = [d for d in range(rank) if d != axis and index.shape[d] != source.shape[d]]
    if cut:
        data = e.node("Slice", [data, e.array("starts", numpy.zeros(len(cut), numpy.int64)),
                                e.array("ends", numpy.asarray([index.shape[d] for d in cut],
                                                              numpy.int64)),
                                e.array("axes", numpy.asarray(cut, numpy.int64))])
    e.node("GatherElements", [data, e.name(args[2])], [e.name(out)], axis=axis)
    # ONNX wraps a negative index where torch raises: a negative one sends the
    # run to the kernels (as an embedding's does: `onnx_chain_ops.embedding`).
    e.floor(e.name(args[2]))


def dim_order_copy(e: Emitter, args: list[int]) -> None:
    """ExecuTorch's copy into a dim order: the values are the source's (an ONNX
    tensor has no layout; a strided out is refused by `Emitter.tensor`), cast as
    `onnx_chain_ops.to_copy` casts when the dtype changes."""
    source, out = e.tensor(args[0]), e.tensor(args[-1])
    if source.dtype != out.dtype:
        to_copy(e, args)
        return
    same_shape(e, args[-1], source.shape)
    e.node("Identity", [e.name(args[0])], [e.name(args[-1])])


def _integer_extreme(op_type: str) -> Translator:
    """minimum/maximum of two integer tensors of one dtype: Min/Max (no NaN to differ on)."""

    def translate(e: Emitter, args: list[int]) -> None:
        first, second, out = (e.tensor(v) for v in (args[0], args[1], args[-1]))
        if first.dtype not in INTEGER_DTYPES or not first.dtype == second.dtype == out.dtype:
            raise NotMapped(f"a {op_type} of {first.dtype} and {second.dtype}")
        same_shape(e, args[-1], broadcast(first, second))
        e.node(op_type, [e.name(args[0]), e.name(args[1])], [e.name(args[-1])])
    return translate


def pow_scalar(e: Emitter, args: list[int]) -> None:
    """`pow.Tensor_Scalar_out(x, n)` of float32 for the exponents torch's kernel computes
    as products and a reciprocal (2, 3, -1, -2: x*x, x*x*x, 1/x, 1/(x*x)), the same
    nodes in the same order; any other exponent goes through pow, whose rounding the
    session's Pow need not share, and is refused."""
    source, out, exponent = e.tensor(args[0]), args[-1], e.scalar(args[1])
    if source.dtype != torch.float32 or e.tensor(out).dtype != torch.float32 or \
            isinstance(exponent, bool) or exponent not in (2, 3, -1, -2):
        raise NotMapped(f"x ** {exponent!r} of {source.dtype}")
    same_shape(e, out, source.shape)
    x, result = e.name(args[0]), e.name(out)
    if exponent == -1:
        e.node("Reciprocal", [x], [result])
        return
    square = e.node("Mul", [x, x], [result] if exponent == 2 else None)
    if exponent == 3:
        e.node("Mul", [square, x], [result])
    elif exponent == -2:
        e.node("Reciprocal", [square], [result])


def log_softmax(e: Emitter, args: list[int]) -> None:
    source, out = e.tensor(args[0]), args[-1]
    dim, half_to_float = e.scalar(args[1]), e.scalar(args[2])
    rank = source.dim()
    if source.dtype != torch.float32 or e.tensor(out).dtype != torch.float32 or \
            half_to_float is not False or not isinstance(dim, int) or rank == 0 or \
            not -rank <= dim < rank or source.shape[dim] == 0:
        raise NotMapped(f"a log_softmax of {source.dtype} over {dim!r}")
    same_shape(e, out, source.shape)
    e.node("LogSoftmax", [e.name(args[0])], [e.name(out)], axis=dim % rank)


_COMPARISONS = {"eq": "Equal", "ne": "NotEqual", "ge": "GreaterOrEqual", "gt": "Greater",
                "le": "LessOrEqual", "lt": "Less"}

ARITHMETIC: dict[str, Translator] = {
    **{f"aten::{name}.Tensor_out": _comparison(op, scalar=False)
       for name, op in _COMPARISONS.items()},
    **{f"aten::{name}.Scalar_out": _comparison(op, scalar=True)
       for name, op in _COMPARISONS.items()},
    "aten::expand_copy.out": expand_copy,
    "aten::add.out": _arithmetic("Add", 2, scalar=False),
    "aten::sub.out": _arithmetic("Sub", 2, scalar=False),
    "aten::mul.out": _arithmetic("Mul", None, scalar=False),
    "aten::add.Scalar_out": _arithmetic("Add", 2, scalar=True),
    "aten::sub.Scalar_out": _arithmetic("Sub", 2, scalar=True),
    "aten::mul.Scalar_out": _arithmetic("Mul", None, scalar=True),
    "aten::cumsum.out": cumsum,
    "aten::arange.out": arange,
    "aten::arange.start_out": arange,
    "aten::gather.out": gather,
    "aten::_log_softmax.out": log_softmax,
    "aten::pow.Tensor_Scalar_out": pow_scalar,
    "aten::minimum.out": _integer_extreme("Min"),
    "aten::maximum.out": _integer_extreme("Max"),
    "dim_order_ops::_to_dim_order_copy.out": dim_order_copy,
    "dim_order_ops::_clone_dim_order.out": dim_order_copy,
}
