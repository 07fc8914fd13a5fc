"""How close is close enough: the tolerance of `--verify` and bundled cases.

Torch-free, so `exirc.compiler` and the CLI can name the defaults cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


@dataclass(frozen=True)
class Tolerance:
    """Elements a, e are close when |a - e| <= atol + rtol * |e| (as torch.isclose)."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    def describe(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


DEFAULT_TOLERANCE = Tolerance()
