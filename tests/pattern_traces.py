"""ExecuTorch's XNNPACKQuantizer, tracing each of its conv-bn patterns once per process.

Not a test module. Every `prepare_pt2e` with ExecuTorch's XNNPACKQuantizer
traces its conv + batch-norm (+ relu) patterns again with a strict
`torch.export` (12 traces, about a third of a pt2e lowering's time in the
oracle tests), though a pattern's graph depends only on the pattern function,
what its closure holds and its example inputs' shapes and dtypes. Here each
is traced once and every later call gets a deep copy (the quantizer edits
the graph it gets), so ExecuTorch's quantization is what it would have been:
`tests/dev/test_pattern_traces.py` compares a prepared model with and without.
"""

from __future__ import annotations

import copy
import functools
import importlib
from collections.abc import Callable, Hashable
from typing import Any

import torch

_UTILS = "executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils"
_NAME = "_get_aten_graph_module_for_pattern"


def trace_patterns_once() -> None:
    """Make ExecuTorch's quantizer trace each conv-bn pattern once in this process
    (idempotent). Call it before `prepare_pt2e` with an XNNPACKQuantizer."""
    utils = importlib.import_module(_UTILS)
    traced = getattr(utils, _NAME)
    if getattr(traced, "_traced_once", False):
        return
    setattr(utils, _NAME, _memoized(traced))


def traces_patterns_once() -> bool:
    """Whether `trace_patterns_once` is in effect."""
    utils = importlib.import_module(_UTILS)
    return bool(getattr(getattr(utils, _NAME), "_traced_once", False))


def undo() -> None:
    """ExecuTorch's own function back (for the test that compares both)."""
    utils = importlib.import_module(_UTILS)
    traced = getattr(utils, _NAME)
    setattr(utils, _NAME, getattr(traced, "__wrapped__", traced))


def _memoized(trace: Callable[..., torch.fx.GraphModule]) -> Callable[..., torch.fx.GraphModule]:
    graphs: dict[Hashable, torch.fx.GraphModule] = {}

    @functools.wraps(trace)
    def traced_once(pattern: Any, example_inputs: tuple[Any, ...], is_cuda: bool = False,
                    **kwargs: Any) -> torch.fx.GraphModule:
        key = _key(pattern, example_inputs, is_cuda, kwargs)
        if key is None:  # not a pattern we can name by value: trace it as ExecuTorch does
            return trace(pattern, example_inputs, is_cuda, **kwargs)
        if key not in graphs:
            graphs[key] = trace(pattern, example_inputs, is_cuda, **kwargs)
        return copy.deepcopy(graphs[key])

    traced_once._traced_once = True  # type: ignore[attr-defined]
    return traced_once


def _key(pattern: Any, example_inputs: tuple[Any, ...], is_cuda: bool,
         kwargs: dict[str, Any]) -> Hashable | None:
    """What the traced graph depends on, or None when that cannot be told by value:
    a pattern that is not a plain function wrapped in a module without state."""
    from torchao.quantization.pt2e import WrapperModule

    function = getattr(pattern, "fn", None)
    if (not isinstance(pattern, WrapperModule) or not callable(function)
            or list(pattern.parameters()) or list(pattern.buffers())
            or not hasattr(function, "__code__")):
        return None
    inputs = []
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            inputs.append(("tensor", tuple(value.shape), value.dtype))
        else:
            inputs.append(("value", value))
    key = (function.__code__, tuple(cell.cell_contents for cell in function.__closure__ or ()),
           tuple(inputs), is_cuda, tuple(sorted(kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key
