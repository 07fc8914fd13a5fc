"""A fused chain at run time: one onnxruntime session (or LiteRT interpreter,
`litert.engine`, which copies inputs in and outputs out) that does a method's work.

`onnx_chain.fuse_chain` builds it at load (when and why: that module's
docstring). Each run reads the caller's checked inputs in place, binding again
only those that moved (or everything, for a new thread count), and the
outputs land in memory of the chain's own, handed out without a copy.

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
from typing import Any

import torch

from exirc.runtime.core.arenas import numpy_dtype
from exirc.runtime.core.inputs import within_storage
from exirc.runtime.engines.onnxruntime.delegate import Binding, session_for_threads


@dataclass
class FusedChain:
    """One chain as one session; `run` does the chain's work, or returns False."""

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
    litert: Any = None  # a LiteRtChain: the chain runs on LiteRT instead (litert.chain)
    _sessions: dict[int, Any] = field(default_factory=dict)
    _binding: Any = None  # a Binding once the first run has bound the tensors
    _bound_for: int = 0  # the thread count `_binding` is for (0: not bound)
    _bound_inputs: list[int] = field(default_factory=list)  # addresses bound
    _floor_view: Any = None

    def __post_init__(self) -> None:
        if self.floor is not None:
            # Read per run through ctypes: right after a session run, a torch or numpy
            # call runs with cold caches (~2 us measured on bert; this ~0.1 us). The
            # tensor is the chain's own, never resized, so its address holds.
            assert self.floor.dtype == torch.int64 and self.floor.numel() == 1
            self._floor_view = ctypes.c_int64.from_address(self.floor.data_ptr())

    def session(self) -> Any:
        """The session for torch's current thread count (made once per count)."""
        return session_for_threads(self._sessions, self.model)

    def run(self, given: Sequence[Any]) -> bool:
        """Run the chain on the session, reading `given` (the run's checked inputs,
        of the shapes and dtypes the model declares); False if the kernels must
        run it instead."""
        tensors = [given[position] for _, position in self.inputs]
        if self.litert is not None:
            return self._run_on_litert(tensors)
        try:
            if torch.get_num_threads() != self._bound_for or \
                    [t.data_ptr() for t in tensors] != self._bound_inputs:
                if not self._bind_inputs(tensors):
                    return False
            else:
                for tensor in tensors:  # a loop, not all(): this runs every call
                    if not tensor.is_contiguous():  # strides changed in place
                        return False
            for memory in self.outputs.values():
                if memory.held_elsewhere():
                    memory.renew(self._binding.binding.bind_output)
            self._binding.run()
        except Exception:  # noqa: BLE001 (any refusal: the kernels raise the right error)
            return False
        return self._floor_view is None or self._floor_view.value >= 0

    def _run_on_litert(self, tensors: list[torch.Tensor]) -> bool:
        """`run` on LiteRT, which copies the inputs in and the outputs out."""
        try:
            for tensor in tensors:
                if not tensor.is_contiguous():
                    return False
            for memory in self.outputs.values():
                if memory.held_elsewhere():
                    memory.renew(_unbound)
            outputs = [memory.tensor for memory in self.outputs.values()]
            self.litert.run(tensors, outputs if self.floor is None else [*outputs, self.floor])
        except Exception:  # noqa: BLE001 (any refusal: the kernels raise the right error)
            return False
        return self._floor_view is None or self._floor_view.value >= 0

    def results(self, given: Sequence[Any], positions: Mapping[int, int], env: list[Any],
                values: list[int], copy: Callable[[Any], Any]) -> list[Any]:
        """The method's outputs after `run`: a view of each the chain wrote, and an
        input (from `given`; `positions`: each input value's position there) or a
        constant (from `env`) passed through `copy` (Method.run's)."""
        outputs = self.outputs
        return [outputs[v].tensor.detach() if v in outputs else copy(
                given[positions[v]] if v in positions else env[v]) for v in values]

    def _bind_inputs(self, tensors: list[torch.Tensor]) -> bool:
        """Bind the run's inputs (and, for a new thread count, all the rest); False
        if one cannot be read in place."""
        if not all(t.is_contiguous() and within_storage(t) for t in tensors):
            return False
        threads = torch.get_num_threads()
        if threads != self._bound_for or self._binding is None:
            self._binding, self._bound_for = self._bind(), threads
        self._bound_inputs = []  # until every input is bound again
        for (name, _), tensor in zip(self.inputs, tensors):
            _bind_tensor(self._binding.binding.bind_input, name, tensor)
        self._bound_inputs = [t.data_ptr() for t in tensors]
        return True

    def _bind(self) -> Binding:
        """A binding of the constants and outputs (which never move); inputs come per run."""
        session = self.session()
        binding = session.io_binding()
        for name, tensor in self.constants:
            _bind_tensor(binding.bind_input, name, tensor)
        for memory in self.outputs.values():
            memory.bind(binding.bind_output)
        if self.floor is not None:
            _bind_tensor(binding.bind_output, FLOOR, self.floor)
        return Binding(session, binding)


class OutputMemory:
    """Where the session writes one output: `tensor`, bound at `address`."""

    __slots__ = ("name", "tensor", "address", "_dtype")

    def __init__(self, name: str, tensor: torch.Tensor) -> None:
        self.name, self.tensor, self.address = name, tensor, tensor.data_ptr()
        self._dtype = numpy_dtype(tensor.dtype)

    def bind(self, bind_output: Callable[..., None]) -> None:
        self.address = self.tensor.data_ptr()
        bind_output(self.name, "cpu", 0, self._dtype, list(self.tensor.shape), self.address)

    def held_elsewhere(self) -> bool:
        """Whether anything but this object may read or move the memory: another
        tensor or a numpy array over the storage, the storage object itself, or
        the storage moved (`share_memory_`, a resize) away from the bound address."""
        if _FREE[0] < 0:
            return True  # this torch cannot say: fresh memory every run
        storage = self.tensor.untyped_storage()
        return (_storage_uses(storage) != _FREE[0] or sys.getrefcount(storage) != _FREE[1]
                or self.tensor.data_ptr() != self.address)

    def renew(self, bind_output: Callable[..., None]) -> None:
        """Move to fresh memory (the caller holds the last) and bind it."""
        self.tensor = torch.empty_like(self.tensor, memory_format=torch.contiguous_format)
        self.bind(bind_output)


def _storage_uses(storage: torch.UntypedStorage) -> int:
    """The tensors and storage handles sharing `storage` (torch's own count: a
    numpy array or DLPack capsule counts through the tensor it keeps). The
    Python storage object is not among them: torch keeps one per storage, whose
    holders only its Python reference count shows."""
    return torch._C._storage_Use_Count(storage._cdata)


def _free_counts() -> tuple[int, int]:
    """`held_elsewhere`'s two counts for a tensor nothing else references, as this
    torch reports them; (-1, -1), so that every output is always renewed (a copy
    per run, as before), if torch cannot say."""
    tensor = torch.empty(1)
    storage = tensor.untyped_storage()
    try:
        return _storage_uses(storage), sys.getrefcount(storage)
    except (AttributeError, RuntimeError):
        return -1, -1


_FREE = _free_counts()


def _unbound(*_: Any) -> None:
    """Memory LiteRT writes needs no binding: outputs are copied into it."""


FLOOR = "least_embedding_index"

FUSED = "one onnxruntime session (the method's chain, fused at load)"
FUSED_ON_LITERT = "one LiteRT interpreter on XNNPACK (the method's chain, fused at load)"


def why_no_delegate(backends: Sequence[tuple[Any, Any]]) -> str:
    """Why a method has no delegate on onnxruntime: its first delegate's reason."""
    reasons = [why for _, handle in backends if (why := getattr(handle, "not_on_onnxruntime", ""))]
    return f"its XNNPACK delegates run on torch: {reasons[0]}" if reasons else \
        "it has no XNNPACK delegate"


def kernel_by_kernel(reason: str) -> str:
    """How a method that is not fused runs, and why it is not."""
    return f"instruction by instruction (not fused: {reason})"


def _bind_tensor(bind: Callable[..., None], name: str, tensor: torch.Tensor) -> None:
    bind(name, "cpu", 0, numpy_dtype(tensor.dtype), list(tensor.shape), tensor.data_ptr())
