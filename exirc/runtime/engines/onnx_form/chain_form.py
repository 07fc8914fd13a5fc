"""A method's chain as one ONNX model, and the method it runs as (`FusedMethod`).

`chain.chain_form` builds the `ChainForm` at load; an engine's runner
(`onnxruntime.chain.OrtChain`, `litert.chain.LiteRtChain`) runs its model. Each
run reads the caller's checked inputs in place, and the outputs land in memory
of the chain's own, handed out without a copy.

Handing out instead of copying: the caller gets a view of the output memory
(a new tensor over the same storage), and before each run an output whose
storage anything but the chain still references (that view, a slice of it,
a numpy array over it) gets fresh memory, bound in its place: a result the
caller keeps is never overwritten, and one dropped is written again in
place. Measured after a session run (cold caches), a clone cost 2.6 us on
mlp and 4.5 us an output on bert; the view and the check cost about a third.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from exirc.runtime.core.arenas import numpy_dtype
from exirc.runtime.engines.torch_private import FREE_COUNTS, storage_uses

if TYPE_CHECKING:
    from exirc.runtime.engines.seam import MethodView

FLOOR = "least_embedding_index"
"""The extra output of a chain with embedding lookups: the least index read.
ONNX wraps a negative index where torch raises, so a negative least index
sends the call back to the kernels."""


@dataclass
class ChainForm:
    """One chain as one ONNX model."""

    model: bytes
    length: int  # the chain's instructions, charged to the run's step budget
    inputs: list[tuple[str, int]]  # method inputs read: name, position in the run's inputs
    constants: list[tuple[str, torch.Tensor]]  # never move: bound once
    # The method's outputs the chain writes, by value, into memory of their own:
    # a plan may put an output over an input it no longer needs, which the
    # kernels finish reading first but a session need not. Each entry's tensor
    # is replaced when a caller still holds its memory (see the docstring).
    outputs: dict[int, OutputMemory]
    floor: torch.Tensor | None  # the least embedding index of the run, if any
    rules: list[str] = field(default_factory=list)  # what each rewrite rule did

    def rules_text(self) -> str:
        return "\n".join(self.rules)

    def floor_ok(self) -> bool:
        """Whether the run read no negative embedding index (always, without lookups)."""
        return self.floor is None or int(self.floor) >= 0


class ChainRunner(Protocol):
    """An engine's way of running a `ChainForm`'s model."""

    def run(self, tensors: list[torch.Tensor]) -> bool:
        """Run on the chain's input tensors, writing its outputs' memory; False if
        the kernels must run the call instead."""


class FusedMethod:
    """A method whose plain runs are one call of an engine's runner."""

    def __init__(self, runner: ChainRunner, form: ChainForm, view: MethodView) -> None:
        self.runner, self.form, self.length = runner, form, form.length
        self.artifacts: list[tuple[str, bytes]] = []  # what --dump-engine writes
        self._positions = dict(view.input_positions)
        self._env = view.env
        self._output_values = list(view.output_values)
        self._copy = view.copy_out
        self._floor_view = None
        if form.floor is not None:
            # Read per run through ctypes: right after a session run, a torch or numpy
            # call runs with cold caches (~2 us measured on bert; this ~0.1 us). The
            # tensor is the chain's own, never resized, so its address holds.
            assert form.floor.dtype == torch.int64 and form.floor.numel() == 1
            self._floor_view = ctypes.c_int64.from_address(form.floor.data_ptr())

    def run(self, given: Sequence[Any]) -> list[Any] | None:
        """The outputs for checked inputs `given`, or None (the kernels run the call)."""
        tensors = [given[position] for _, position in self.form.inputs]
        if not self.runner.run(tensors):
            return None
        if self._floor_view is not None and self._floor_view.value < 0:
            return None
        outputs, positions, env, copy = self.form.outputs, self._positions, self._env, self._copy
        return [outputs[v].tensor.detach() if v in outputs else copy(
                given[positions[v]] if v in positions else env[v]) for v in self._output_values]


class OutputMemory:
    """Where the chain writes one output: `tensor`, bound at `address`."""

    __slots__ = ("name", "tensor", "address", "dtype")

    def __init__(self, name: str, tensor: torch.Tensor) -> None:
        self.name, self.tensor, self.address = name, tensor, tensor.data_ptr()
        self.dtype = numpy_dtype(tensor.dtype)

    def held_elsewhere(self) -> bool:
        """Whether anything but this object may read or move the memory: another
        tensor or a numpy array over the storage, the storage object itself, or
        the storage moved (`share_memory_`, a resize) away from the bound address."""
        if FREE_COUNTS is None:
            return True  # this torch cannot say: fresh memory every run
        storage = self.tensor.untyped_storage()
        return (storage_uses(storage) != FREE_COUNTS[0]
                or sys.getrefcount(storage) != FREE_COUNTS[1]
                or self.tensor.data_ptr() != self.address)

    def renew(self, bind: Callable[[OutputMemory], None] | None = None) -> None:
        """Move to fresh memory (the caller holds the last), and `bind` it if the
        engine binds memory by address."""
        self.tensor = torch.empty_like(self.tensor, memory_format=torch.contiguous_format)
        self.address = self.tensor.data_ptr()
        if bind is not None:
            bind(self)


def renew_held(outputs: Mapping[int, OutputMemory],
               bind: Callable[[OutputMemory], None] | None = None) -> None:
    """Before a run: fresh memory for each output a caller still holds."""
    for memory in outputs.values():
        if memory.held_elsewhere():
            memory.renew(bind)
