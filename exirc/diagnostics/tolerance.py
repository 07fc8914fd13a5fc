"""How close is close enough: the tolerance of `--verify` and bundled cases.

By default the tolerance follows the dtype of the values compared, as
`torch.testing.assert_close` does: half-precision results cannot agree to
float32's digits (an op decomposed into several fp16 ops rounds each step),
so float16 and bfloat16 get torch's looser defaults. Every other dtype gets
exirc's own (`DEFAULT_RTOL`, `DEFAULT_ATOL`). An `rtol` or `atol` given
explicitly (`--rtol`, `--atol`) applies to every dtype.

Torch-free, so `exirc.compiler` and the CLI can name the defaults cheaply:
dtypes are named as torch prints them without `torch.` (`float16`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5

# (rtol, atol) by dtype where they differ from the defaults: torch.testing's.
DTYPE_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}


@dataclass(frozen=True)
class Tolerance:
    """Elements a, e are close when |a - e| <= atol + rtol * |e| (as torch.isclose).

    `rtol` or `atol` None: by the dtype compared (`DTYPE_DEFAULTS`, else the
    defaults)."""

    rtol: float | None = None
    atol: float | None = None

    def for_dtype(self, dtype: str | None) -> tuple[float, float]:
        """(rtol, atol) for values of `dtype` (None: a Python number)."""
        rtol, atol = DTYPE_DEFAULTS.get(dtype or "", (DEFAULT_RTOL, DEFAULT_ATOL))
        return (rtol if self.rtol is None else self.rtol,
                atol if self.atol is None else self.atol)

    def loosest(self, dtypes: Iterable[str]) -> tuple[float, float]:
        """The largest (rtol, atol) over `dtypes`: one tolerance for all of them."""
        pairs = [self.for_dtype(d) for d in {*dtypes, None}]
        return max(r for r, _ in pairs), max(a for _, a in pairs)

    def describe(self, dtypes: Iterable[str] = ()) -> str:
        """`rtol 0.0001, atol 1e-05`; with the dtypes compared, those whose tolerance
        differs are named: `float16: rtol 0.001, atol 1e-05`."""
        base = self.for_dtype(None)
        names = sorted(set(dtypes))
        own = [d for d in names if self.for_dtype(d) != base]
        parts = [_pair(*base)] if len(own) < len(names) or not names else []
        parts += [f"{d}: {_pair(*self.for_dtype(d))}" for d in own]
        return "; ".join(parts)


def _pair(rtol: float, atol: float) -> str:
    return f"rtol {rtol:g}, atol {atol:g}"


DEFAULT_TOLERANCE = Tolerance()
