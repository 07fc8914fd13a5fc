"""Decompositions torch lacks, from non-core ATen ops to core ones.

`x.max()` and `x.min()` (a reduction over every element) are not core ATen
and torch's tables have no decomposition for them, yet their core cousins
`amax`/`amin` compute the same over all dims (an empty dim list means all).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _max_of_all(x: torch.Tensor) -> torch.Tensor:
    return aten.amax.default(x, [])


def _min_of_all(x: torch.Tensor) -> torch.Tensor:
    return aten.amin.default(x, [])


EXTRA_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.max.default: _max_of_all,
    aten.min.default: _min_of_all,
}
