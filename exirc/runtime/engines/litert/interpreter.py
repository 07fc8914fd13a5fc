"""Running a fused chain's TFLite form on LiteRT, whose CPU path is XNNPACK.

An interpreter is made per thread count (its thread count is fixed when it is
made). Each run copies the inputs into the interpreter's input tensors,
invokes, and copies the outputs into the caller's memory: plain memcpy
between the interpreter's tensor addresses (read once, see `_Runner`) and
the caller's, of the byte counts the model declares, which were checked
against the interpreter's own tensors when it was made. The wrapper's
`invoke` is bypassed for the binding's own `Invoke`: the wrapper only checks
that no numpy view of the interpreter's memory is alive, and none is made.

This is the one place LiteRT's private Python API is used (`Interpreter.
_interpreter`: its `Invoke` and `tensor` views, whose addresses are read once);
`tests/runtime/engines/test_private_apis.py` fails loudly when a release
changes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy
import torch

Declared = tuple[tuple[int, ...], Any]  # a shape and a numpy dtype


def litert_available() -> bool:
    """Whether LiteRT's Python package is installed (imported only when used)."""
    return importlib.util.find_spec("ai_edge_litert") is not None


class LiteRtInterpreters:
    """A TFLite model and its interpreters (one per thread count); `run` does one call."""

    def __init__(self, model: bytes, inputs: Sequence[Declared],
                 outputs: Sequence[Declared]) -> None:
        """`inputs`/`outputs`: each model input/output in order, by shape and
        numpy dtype."""
        self.model = model
        self._declared = [(tuple(shape), numpy.dtype(dtype)) for shape, dtype in
                          [*inputs, *outputs]]
        self._inputs = len(inputs)
        self._runners: dict[int, _Runner] = {}

    def runner(self) -> _Runner:
        """The interpreter for torch's current thread count (chosen once per count)."""
        threads = max(torch.get_num_threads(), 1)
        runner = self._runners.get(threads)
        if runner is None:
            runner = self._runners[threads] = self._faster(threads)
        return runner

    def _faster(self, threads: int) -> _Runner:
        """An interpreter of `threads` threads, or of one if that runs this model
        faster: for a small model a second thread can cost more in handing work
        over between operators than it saves (measured on vit_tiny: 29 us on one
        thread, 44 on two; a small convolutional model gains: 76 -> 45 us). The
        two are timed at load, back to back as runs come (alternating would time
        the many-thread pool waking from sleep each call), on the zeros `_Runner`
        leaves in the inputs; not if one run takes over `_MEASURED_UP_TO` s."""
        many = _Runner(self.model, threads, self._declared, self._inputs)
        if threads == 1:
            return many
        one = self._runners.get(1) or _Runner(self.model, 1, self._declared, self._inputs)
        medians = []
        for runner in (many, one):
            timings = []
            for _ in range(_TIMED_RUNS):
                start = time.perf_counter()
                runner.invoke()
                timings.append(time.perf_counter() - start)
                if timings[-1] > _MEASURED_UP_TO:
                    return many
            medians.append(statistics.median(timings[_TIMED_RUNS // 3:]))  # after warming
        return one if medians[1] < medians[0] else many

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Read `inputs` and write `outputs` (contiguous, of the declared shapes and
        dtypes: the caller checked them)."""
        self.runner().run(inputs, outputs)


class _Runner:
    """One interpreter, its input and output tensor indices and byte counts."""

    def __init__(self, model: bytes, threads: int, declared: list[Declared],
                 count: int) -> None:
        from ai_edge_litert.interpreter import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
            Interpreter,
        )

        self.threads = threads
        self.interpreter = Interpreter(model_content=model, num_threads=threads)
        with _quiet_first_delegate():
            self.interpreter.allocate_tensors()
        details = [*self.interpreter.get_input_details(),
                   *self.interpreter.get_output_details()]
        if len(details) != len(declared):
            raise RuntimeError(f"the interpreter has {len(details)} inputs and outputs, "
                               f"the chain {len(declared)}")
        for detail, (shape, dtype) in zip(details, declared):
            if tuple(detail["shape"]) != shape or detail["dtype"] != dtype:
                raise RuntimeError(f"interpreter tensor {detail['name']} is "
                                   f"{tuple(detail['shape'])} {detail['dtype']}, the chain's "
                                   f"{shape} {dtype}")
        if len(self.interpreter.get_input_details()) != count:
            raise RuntimeError("the interpreter's inputs are not the chain's")
        self.inputs = [(_address(self.interpreter, d["index"]), _nbytes(s, t)) for d, (s, t)
                       in zip(details[:count], declared[:count])]
        self.outputs = [(_address(self.interpreter, d["index"]), _nbytes(s, t)) for d, (s, t)
                        in zip(details[count:], declared[count:])]
        self._invoke = self.interpreter._interpreter.Invoke
        # The addresses are read once (reading one costs ~1.6 us, the whole run of a
        # small MLP ~1): TFLite moves a tensor only when it allocates again (a
        # resize, which nothing here calls) or for a tensor of dynamic shape, which
        # a chain's model, static shapes and constant shape operands, never has.
        # Two runs confirm it for this interpreter before it is used (on zeros: an
        # embedding's indices must be in range).
        for address, size in self.inputs:
            ctypes.memset(address, 0, size)
        for _ in range(2):
            self._invoke(0)
            if [a for a, _ in self.inputs + self.outputs] != [
                    _address(self.interpreter, d["index"]) for d in details]:
                raise RuntimeError("LiteRT moved an input or output tensor between runs")

    def invoke(self) -> None:
        """One call on whatever the inputs hold."""
        self._invoke(0)

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        move = ctypes.memmove
        for (address, size), tensor in zip(self.inputs, inputs):
            move(address, tensor.data_ptr(), size)
        self._invoke(0)  # subgraph 0: the model's only one
        for (address, size), tensor in zip(self.outputs, outputs):
            move(tensor.data_ptr(), address, size)


def _address(interpreter: Any, index: int) -> int:
    """Where tensor `index`'s data is, through a view dropped at once (the public
    `Interpreter.invoke` refuses to run while one is alive)."""
    inner = interpreter._interpreter
    view = inner.tensor(inner, index)
    if not isinstance(view, numpy.ndarray) or view.ndim == 0 or view.base is None:
        raise RuntimeError(f"LiteRT gave no view of tensor {index}'s memory")
    return int(view.__array_interface__["data"][0])


_TIMED_RUNS = 15
_MEASURED_UP_TO = 0.005  # seconds a run: a model this slow has work for every thread


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return math.prod(shape) * dtype.itemsize


_QUIETED = [False]


@contextlib.contextmanager
def _quiet_first_delegate() -> Iterator[None]:
    """LiteRT announces its first XNNPACK delegate on stderr (C++, once a process,
    no setting turns it off): silence file descriptor 2 around that one call."""
    if _QUIETED[0]:
        yield
        return
    _QUIETED[0] = True
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
