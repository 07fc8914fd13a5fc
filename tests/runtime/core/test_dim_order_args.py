"""Dim orders: a tensor's must be a permutation (the reader's check), and the
dim-order copies' `dim_order` arguments must fit their outs (checked at load)."""

from __future__ import annotations

import pytest
import torch

from exirc.errors import FormatError
from exirc.runtime import load
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_argument_checks import AT, add_over_self
from tests.runtime.core.test_interpreter import build, planned

F32 = P.ScalarType.FLOAT


def test_a_tensor_dim_order_that_is_not_a_permutation_is_refused_when_read() -> None:
    """The reader refuses it (exirc.serialize.decode), before any check here."""
    broken = P.Tensor(F32, [2, 3], [0, 0], allocation_info=P.AllocationDetails.at(1, 0))
    with pytest.raises(FormatError, match=r"values\[4\]\.val\(Tensor\)\.dim_order: \[0, 0\] "
                                          "is not a permutation of the 2 dimensions"):
        load(serialize(add_over_self(broken)))


def dim_order_copy(order: list[int], out: P.Tensor) -> P.Program:
    values: list[P.EValue] = [planned(0, [2, 3]), P.Bool(False),
                              *(P.Int(i) for i in order), P.IntList(list(range(2, 2 + len(order)))),
                              out]
    args = [0, 1, len(values) - 2, len(values) - 1]
    return build(values, [P.KernelCall(0, args)], ["dim_order_ops::_to_dim_order_copy.out"],
                 inputs=[0], outputs=[len(values) - 1])


def test_a_dim_order_argument_that_is_not_a_permutation_is_refused() -> None:
    with pytest.raises(FormatError, match=AT.format(0, r"dim_order_ops::_to_dim_order_copy\.out")
                       + r"argument 'dim_order' \[1, 1\] is not a permutation of the 2 "):
        load(serialize(dim_order_copy([1, 1], planned(32, [2, 3]))))


def test_a_dim_order_argument_must_be_the_outs() -> None:
    with pytest.raises(FormatError, match=r"argument 'dim_order' \[1, 0\] is not the dim order "
                                          r"of argument 'out' \(value 5\), \[0, 1\]"):
        load(serialize(dim_order_copy([1, 0], planned(32, [2, 3]))))


def test_a_dim_order_copy_into_its_layout_runs() -> None:
    out = P.Tensor(F32, [2, 3], [1, 0], allocation_info=P.AllocationDetails.at(1, 32))
    x = torch.randn(2, 3)
    (result,) = load(serialize(dim_order_copy([1, 0], out))).run("forward", [x])
    assert torch.equal(result, x)
    assert result.stride() == (1, 2)


def test_a_dim_order_copy_of_another_size_is_refused() -> None:
    with pytest.raises(FormatError, match=r"argument 'out' \(value 5\) has sizes \[3, 2\], but "
                                          r"the operator writes \[2, 3\]"):
        load(serialize(dim_order_copy([0, 1], planned(32, [3, 2]))))


def empty_dim_order(size: list[int], out: P.Tensor) -> P.Program:
    """out = _empty_dim_order(size) in out's own (contiguous) dim order."""
    count = len(size)
    values: list[P.EValue] = [*(P.Int(s) for s in size), P.IntList(list(range(count))),
                              *(P.Int(d) for d in range(len(out.sizes))),
                              P.IntList(list(range(count + 1, count + 1 + len(out.sizes)))),
                              out]
    size_list, order_list, out_index = count, len(values) - 2, len(values) - 1
    return build(values, [P.KernelCall(0, [size_list, order_list, out_index])],
                 ["dim_order_ops::_empty_dim_order.out"], inputs=[], outputs=[out_index])


def test_an_empty_of_another_rank_than_its_out_is_refused() -> None:
    with pytest.raises(FormatError, match=AT.format(0, r"dim_order_ops::_empty_dim_order\.out")
                       + r"argument 'out' \(value 5\) has 2 dimensions, but argument 'size' "
                       r"\(value 1\) has 1"):
        load(serialize(empty_dim_order([4], planned(0, [2, 2]))))


def test_an_empty_of_its_outs_size_runs() -> None:
    (out,) = load(serialize(empty_dim_order([2, 2], planned(0, [2, 2])))).run("forward", [])
    assert out.shape == (2, 2)
