"""torch's Python bindings stand in for the boxed dispatcher call only where
they run the very same overload (`exirc.runtime.kernels.fast_entries`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from exirc.runtime.kernels import fast_entries
from exirc.runtime.kernels.registry import aten_kernel


def _t(*sizes: int) -> torch.Tensor:
    return torch.rand(*sizes) + 0.5  # inside every listed op's domain (log, sqrt, div)


# Per operator: (positional arguments, keyword-only ones) as binding passes them.
# Defaults are left out, as binding leaves them out; then again given explicitly.
SAMPLES: dict[str, Callable[[], tuple[list[Any], dict[str, Any]]]] = {
    **{f"aten::{name}.out": (lambda: ([_t(2, 3), _t(2, 3)], {"alpha": 2}))
       for name in ("add", "sub")},
    **{f"aten::{name}.out": (lambda: ([_t(2, 3), _t(1, 3)], {}))
       for name in ("mul", "div", "maximum", "minimum")},
    **{f"aten::{name}.out": (lambda: ([_t(2, 3)], {}))
       for name in ("tanh", "sigmoid", "exp", "log", "neg", "abs", "sqrt", "rsqrt")},
    "aten::hardtanh.out": lambda: ([_t(2, 3) * 2 - 1.5, -0.5, 0.5], {}),
    "aten::leaky_relu.out": lambda: ([_t(2, 3) - 1.0, 0.25], {}),
    "aten::cumsum.out": lambda: ([_t(2, 3), 1], {"dtype": torch.float64}),
    "aten::pow.Tensor_Scalar_out": lambda: ([_t(2, 3), 3], {}),
    "aten::bitwise_and.Tensor_out": lambda: ([_t(2, 3) > 1.0, _t(2, 3) > 0.8], {}),
    "aten::logical_and.out": lambda: ([_t(2, 3) > 1.0, _t(2, 3) > 0.8], {}),
    "aten::lt.Scalar_out": lambda: ([_t(2, 3), 1], {}),
    "aten::gt.Scalar_out": lambda: ([_t(2, 3), 1.25], {}),
    "aten::addmm.out": lambda: ([_t(4), _t(2, 3), _t(3, 4)], {"beta": 0.5, "alpha": 2}),
    "aten::mm.out": lambda: ([_t(2, 3), _t(3, 4)], {}),
    "aten::bmm.out": lambda: ([_t(2, 2, 3), _t(2, 3, 4)], {}),
    "aten::baddbmm.out": lambda: ([_t(2, 2, 4), _t(2, 2, 3), _t(2, 3, 4)], {"beta": 2}),
    "aten::_softmax.out": lambda: ([_t(2, 3), 1, False], {}),
    "aten::cat.out": lambda: ([[_t(2, 3), _t(1, 3)], 0], {}),
    "aten::gelu.out": lambda: ([_t(2, 3)], {"approximate": "tanh"}),
    "aten::where.self_out": lambda: ([_t(2, 3) > 1.0, _t(2, 3), _t(2, 3)], {}),
    "aten::eq.Tensor_out": lambda: ([_t(2, 3).round(), _t(2, 3).round()], {}),
    "aten::le.Tensor_out": lambda: ([_t(2, 3), _t(2, 3)], {}),
    "aten::ne.Scalar_out": lambda: ([_t(2, 3).round(), 1], {}),
    "aten::ge.Scalar_out": lambda: ([_t(2, 3), 0.75], {}),
}


_OUT_DTYPES = {name: torch.bool for name in ("eq", "ne", "le", "lt", "ge", "gt", "bitwise_and",
                                             "logical_and")}


class _Overloads(TorchDispatchMode):
    """Records the overloads that reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def test_every_fast_entry_has_a_sample() -> None:
    assert fast_entries.operator_keys() == set(SAMPLES)


@pytest.mark.parametrize("key", sorted(SAMPLES))
@pytest.mark.parametrize("defaults", ["left out", "given"])
def test_the_binding_runs_the_same_overload_with_the_same_result(key: str,
                                                                 defaults: str) -> None:
    kernel = aten_kernel(*key.rsplit(".", 1))
    assert kernel is not None and isinstance(kernel.fn, functools.partial)
    handle = kernel.fn.args[0]
    entry = fast_entries.entry_for(key, handle)
    assert entry is not None
    torch.manual_seed(0)
    positional, keywords = SAMPLES[key]()
    if defaults == "left out":
        keywords = {}
    # Comparisons write bool; a cumsum asked for float64 writes float64.
    dtype = _OUT_DTYPES.get(key.partition("::")[2].partition(".")[0], torch.float32)
    if key == "aten::cumsum.out" and keywords:
        dtype = torch.float64
    boxed_out, fast_out = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype)
    with _Overloads() as boxed_calls:
        kernel.fn(*positional, **keywords, out=boxed_out)
    with _Overloads() as fast_calls:
        entry(*positional, **keywords, out=fast_out)
    overload = kernel.schema.name.removeprefix("aten::")
    expected = getattr(getattr(torch.ops.aten, overload), kernel.schema.overload_name)
    assert boxed_calls.seen == [expected]
    assert fast_calls.seen == [expected]
    assert torch.equal(boxed_out, fast_out)


def test_a_kernel_registered_under_an_aten_name_keeps_its_own_callable() -> None:
    kernel = aten_kernel("aten::mul", "out")
    assert kernel is not None and isinstance(kernel.fn, functools.partial)
    other_handle = torch.ops.aten.add.out._handle
    assert fast_entries.entry_for("aten::mul.out", other_handle) is None
    assert fast_entries.entry_for("aten::mul.out", kernel.fn.args[0]) is torch.mul
    assert fast_entries.entry_for("aten::index_select.out", kernel.fn.args[0]) is None
