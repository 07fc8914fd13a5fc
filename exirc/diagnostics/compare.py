"""Comparing values against a reference, within a tolerance.

`compare(actual, expected, tolerance)` is what every check uses: `exirc
compile --verify` for outputs and for each instruction's result, `exirc run
--check` for bundled cases. Values are tensors, numpy arrays, scalars or
lists of them. The rules:

  * dtypes and shapes must be equal (a float64 result where float32 was
    expected is a mismatch, however close the numbers);
  * floating-point elements are close when |a - e| <= atol + rtol * |e|
    (torch.isclose), with the tolerance of the expected dtype (float16 and
    bfloat16 looser, `exirc.diagnostics.tolerance`); NaN equals NaN, and an
    infinity equals the same infinity;
  * integers and bools must be equal.

A `Difference` says whether they match and, when not, where the worst
element is and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from exirc.diagnostics.tolerance import Tolerance

__all__ = ["Difference", "Tolerance", "compare", "describe_failures", "float_dtypes", "number",
           "preview", "worst"]

PREVIEW_VALUES = 6


@dataclass(frozen=True)
class Difference:
    """How an actual value compares to the expected one."""

    ok: bool
    max_abs: float = 0.0  # over every element; inf where a NaN or inf is unmatched
    max_rel: float = 0.0  # |a - e| / |e| over elements with e != 0
    problem: str = ""  # a mismatch that is not about numbers: dtype, shape, length, type
    at: tuple[int, ...] | None = None  # the element furthest beyond the tolerance
    actual: Any = None  # the values at `at`
    expected: Any = None
    mismatched: int = 0  # elements beyond the tolerance
    count: int = 0  # elements compared

    def describe(self) -> str:
        """`max abs error 0.25 (rel 0.5) at [1, 2]: got 0.75, expected 1; 3 of 8 elements
        differ`, or what else is wrong."""
        if self.problem:
            return self.problem
        text = f"max abs error {self.max_abs:.3g} (rel {self.max_rel:.3g})"
        if self.at is not None:
            where = f" at [{', '.join(map(str, self.at))}]" if self.at else ""
            text += f"{where}: got {number(self.actual)}, expected {number(self.expected)}"
        if not self.ok and self.count > 1:
            text += f"; {self.mismatched} of {self.count} elements differ"
        return text


def compare(actual: Any, expected: Any, tolerance: Tolerance) -> Difference:
    """Compare `actual` with `expected` (see the module docstring)."""
    actual, expected = _as_tensor(actual), _as_tensor(expected)
    if isinstance(expected, (list, tuple)):
        return _compare_lists(actual, expected, tolerance)
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return Difference(False, problem=f"a {type(actual).__name__}, expected a tensor")
        return _compare_tensors(actual, expected, tolerance)
    return _compare_scalars(actual, expected, tolerance)


def float_dtypes(values: Iterable[Any]) -> list[str]:
    """The names of the floating-point dtypes among the tensors in `values` (nested
    lists too), for `Tolerance.describe` and `Tolerance.loosest`."""
    names: list[str] = []
    for value in values:
        value = _as_tensor(value)
        if isinstance(value, (list, tuple)):
            found = float_dtypes(value)
        elif isinstance(value, torch.Tensor) and (value.is_floating_point() or
                                                  value.is_complex()):
            found = [dtype_name(value.dtype)]
        else:
            found = []
        names.extend(name for name in found if name not in names)
    return names


def worst(differences: Sequence[Difference]) -> float:
    """The largest max abs error of `differences` (0 for none)."""
    return max((d.max_abs for d in differences), default=0.0)


def describe_failures(problem: str, outputs: Sequence[tuple[int, Difference]]) -> list[str]:
    """What is wrong with a run's outputs: `problem` if there is one (it concerns
    them all), else `output_0: max abs error ...` per output that differs."""
    if problem:
        return [problem]
    return [f"output_{i}: {d.describe()}" for i, d in outputs if not d.ok]


def preview(value: Any, count: int = PREVIEW_VALUES) -> str:
    """The first few values, `[0.1, -0.2, ...]`, for reports."""
    value = _as_tensor(value)
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        items = flat[:count].tolist()
        more = ", ..." if flat.numel() > count else ""
        return f"[{', '.join(number(v) for v in items)}{more}]"
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(preview(v, count) for v in value[:count])}]"
    return number(value)


def number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.6g}"
    return str(value)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------


def _as_tensor(value: Any) -> Any:
    if isinstance(value, numpy.ndarray):
        return torch.from_numpy(numpy.ascontiguousarray(value))
    if isinstance(value, numpy.generic):
        return value.item()
    return value


def _compare_lists(actual: Any, expected: Sequence[Any], tolerance: Tolerance) -> Difference:
    if not isinstance(actual, (list, tuple)):
        return Difference(False, problem=f"a {type(actual).__name__}, expected a list")
    if len(actual) != len(expected):
        return Difference(False, problem=f"{len(actual)} items, expected {len(expected)}")
    parts = [compare(a, e, tolerance) for a, e in zip(actual, expected)]
    for i, part in enumerate(parts):
        if not part.ok:
            problem = f"item {i}: {part.describe()}"
            return Difference(False, part.max_abs, part.max_rel, problem, part.at, part.actual,
                              part.expected, part.mismatched, part.count)
    return Difference(True, worst(parts), max((p.max_rel for p in parts), default=0.0),
                      count=sum(p.count for p in parts))


def _compare_scalars(actual: Any, expected: Any, tolerance: Tolerance) -> Difference:
    if isinstance(actual, torch.Tensor) and actual.ndim == 0:
        actual = actual.item()
    kinds = (bool, int, float)
    if not isinstance(actual, kinds) or not isinstance(expected, kinds):
        ok = actual == expected
        return Difference(bool(ok), problem="" if ok else
                          f"{actual!r:.40}, expected {expected!r:.40}")
    if isinstance(expected, float) or isinstance(actual, float):
        a, e = float(actual), float(expected)
        error = _scalar_error(a, e)
        rtol, atol = tolerance.for_dtype(None)
        ok = math.isclose(a, e, rel_tol=rtol, abs_tol=atol) or \
            (math.isnan(a) and math.isnan(e)) or a == e
        rel = error / abs(e) if e and math.isfinite(e) else 0.0
        return Difference(ok, 0.0 if ok and not math.isfinite(error) else error, rel,
                          at=() if not ok else None, actual=a, expected=e,
                          mismatched=0 if ok else 1, count=1)
    ok = actual == expected and type(actual) is type(expected)
    if ok:
        return Difference(True, count=1)
    if type(actual) is not type(expected):
        return Difference(False, problem=f"{type(actual).__name__} {actual!r}, expected "
                                         f"{type(expected).__name__} {expected!r}")
    error = float(abs(int(actual) - int(expected)))
    return Difference(False, error, error / abs(int(expected)) if expected else 0.0, at=(),
                      actual=actual, expected=expected, mismatched=1, count=1)


def _scalar_error(a: float, e: float) -> float:
    if math.isnan(a) and math.isnan(e) or a == e:
        return 0.0
    return abs(a - e) if math.isfinite(a) and math.isfinite(e) else math.inf


def _compare_tensors(actual: torch.Tensor, expected: torch.Tensor,
                     tolerance: Tolerance) -> Difference:
    if actual.dtype != expected.dtype:
        return Difference(False, problem=f"dtype {dtype_name(actual.dtype)}, expected "
                                         f"{dtype_name(expected.dtype)}")
    if actual.shape != expected.shape:
        return Difference(False, problem=f"shape {list(actual.shape)}, expected "
                                         f"{list(expected.shape)}")
    count = expected.numel()
    if count == 0:
        return Difference(True)
    a, e = actual.detach(), expected.detach()
    rtol, atol = tolerance.for_dtype(dtype_name(e.dtype))
    if e.is_complex():
        a, e = torch.view_as_real(a), torch.view_as_real(e)
    if e.is_floating_point():
        a64, e64 = a.to(torch.float64), e.to(torch.float64)
        close = torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        diff = (a64 - e64).abs()
        # Equal infinities subtract to NaN, and so do two NaNs: both are matches.
        # An unmatched NaN or infinity is the worst error there is.
        diff = torch.where(close, torch.where(diff.isfinite(), diff, 0.0),
                           torch.where(diff.isnan(), math.inf, diff))
    else:
        a64, e64 = a.to(torch.float64), e.to(torch.float64)
        close = a == e
        diff = (a64 - e64).abs()
    magnitude = e64.abs()
    relative = torch.where(magnitude > 0, diff / magnitude, torch.zeros_like(diff))
    mismatched = int((~close).sum().item())
    max_abs = float(diff.max().item())
    max_rel = float(relative.max().item())
    if mismatched == 0:
        return Difference(True, max_abs, max_rel, count=count)
    # The element furthest beyond its own tolerance.
    excess = torch.where(close, -math.inf, diff - (atol + rtol * magnitude))
    flat_index = int(excess.reshape(-1).argmax().item())
    at = tuple(int(i) for i in numpy.unravel_index(flat_index, tuple(a.shape)))
    return Difference(False, max_abs, max_rel, at=at, actual=a[at].item(),
                      expected=e[at].item(), mismatched=mismatched, count=count)
