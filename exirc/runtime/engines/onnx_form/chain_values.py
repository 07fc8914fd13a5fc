"""The values a fused chain (`onnx_chain`) reads and writes, and the memory under them.

A plan reuses memory: a value no instruction writes may be a view of bytes
another instruction wrote (a select or slice of whole rows), and a later write
may overwrite bytes a value still to be read lives in. The kernels see the
new bytes; a session, whose edges are values, would see the old ones. So the
builder notes every write with its bytes and every read with its position,
reads a view as a Reshape (or Slice) of the value whose bytes it covers, and
refuses the chain when a read would see bytes written over since. Values
computed at load (`onnx_chain_folding`) are kept too, as constants.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from exirc.runtime.engines.onnx_form.builder import NotMapped, OnnxNodes
from exirc.runtime.engines.onnx_form.chain_ops import ONNX_TYPES
from exirc.serialize import program as P


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes a contiguous tensor occupies, as [start, stop) addresses."""
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


class ChainValues(OnnxNodes):
    """Reads, writes and views of a method's values while its chain is translated,
    into the nodes and initializers `OnnxNodes` collects (the `Emitter` interface
    is completed by the subclass, `chain._Builder`)."""

    def __init__(self, plan: P.ExecutionPlan, env: list[Any], written: frozenset[int]) -> None:
        super().__init__()
        self.plan, self.env, self.written = plan, env, written
        self.produced: set[int] = set()
        self.read: set[int] = set()
        # Written values in order, with their bytes, and where each is read: a
        # plan reuses memory, so a view's bytes and an overwrite are found by address.
        self.position = 0
        self.order: list[tuple[int, int]] = []
        self.spans: dict[int, tuple[int, int]] = {}
        self.uses: list[tuple[int, int]] = []
        self.folded: dict[int, torch.Tensor] = {}  # values computed at load, by value

    def name(self, value: int) -> str:
        self.tensor(value)
        return f"e{value}"

    def tensor(self, value: int) -> torch.Tensor:
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        tensor = self.env[value] if meta is not None else None
        if not isinstance(meta, P.Tensor) or not isinstance(tensor, torch.Tensor):
            raise NotMapped(f"value {value} is not a tensor")
        if meta.shape_dynamism != P.TensorShapeDynamism.STATIC or \
                tensor.dtype not in ONNX_TYPES or not tensor.is_contiguous():
            raise NotMapped(f"value {value} is dynamic, strided or of an unmapped dtype")
        return tensor

    def scalar(self, value: int) -> Any:
        if value in self.written or not 0 <= value < len(self.env):
            raise NotMapped(f"value {value} changes at run time")
        return self.env[value]

    def items(self, value: int) -> list[int | None] | None:
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        if not isinstance(meta, (P.TensorList, P.OptionalTensorList)):
            return None
        return [None if item == -1 else item for item in meta.items]

    def constant(self, value: int) -> torch.Tensor:
        if value in self.folded:
            return self.folded[value]
        if not self._is_constant(value):
            raise NotMapped(f"value {value} is not a constant")
        return self.tensor(value)

    def _known(self, value: int) -> bool:
        """Whether `value` is the same every run and known at load: a constant of the
        file, a value folded at load, a list of those, a scalar no instruction writes."""
        if not 0 <= value < len(self.plan.values):
            return False
        meta = self.plan.values[value]
        if isinstance(meta, P.Tensor):
            return self._is_constant(value) or value in self.folded
        if isinstance(meta, (P.TensorList, P.OptionalTensorList)):
            return all(item == -1 or self._known(item) for item in meta.items)
        return value not in self.written


    def _reads(self, value: int) -> None:
        """Note a value the chain reads; `read` keeps those it has not written first."""
        if value in self.written:
            raise NotMapped(f"value {value} changes at run time")
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        if isinstance(meta, (P.TensorList, P.OptionalTensorList)):
            for item in meta.items:  # computed items are read (constants: initializers)
                if item != -1 and not self._is_constant(item):
                    self._reads(item)
            return
        if not isinstance(meta, P.Tensor):
            return  # scalars become attributes or initializers
        if value not in self.produced and meta.allocation_info is not None and \
                value not in self.plan.inputs:
            self._view_of_written(value)
        if value in self.produced:
            self.uses.append((self.position, value))
        else:
            self.read.add(value)

    def _covers(self, source: int, source_span: tuple[int, int], value: int,
                span: tuple[int, int]) -> bool:
        """Whether `source`'s bytes hold all of `value`'s, whole elements of one dtype."""
        itemsize = self.env[source].element_size()
        return source_span[0] <= span[0] < span[1] <= source_span[1] and \
            self.env[source].dtype == self.env[value].dtype and \
            (span[0] - source_span[0]) % itemsize == 0

    def _view(self, value: int, source: int, source_span: tuple[int, int],
              span: tuple[int, int]) -> None:
        """`value` as the elements of `source` at its bytes (both contiguous)."""
        elements = self.name(source)
        if span != source_span:
            itemsize = self.env[source].element_size()
            first = (span[0] - source_span[0]) // itemsize
            flat = self.node("Reshape", [elements, self.array("flat", numpy.asarray(
                [-1], numpy.int64))])
            elements = self.node("Slice", [flat, self.array("start", numpy.asarray(
                [first], numpy.int64)), self.array("end", numpy.asarray(
                    [first + self.env[value].numel()], numpy.int64))])
        self.node("Reshape", [elements, self.array(
            "shape", numpy.asarray(self.env[value].shape, numpy.int64))], [self.name(value)])
        self._writes(value)

    def _is_constant(self, value: int) -> bool:
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        return isinstance(meta, P.Tensor) and bool(meta.data_buffer_idx) and \
            meta.allocation_info is None

    def _view_of_written(self, value: int) -> None:
        """A planned value no instruction writes is a view: of the bytes the last write
        to its memory left, or of an input's (when nothing wrote there). Read as a
        Reshape of that value, or of the run of its elements it covers (a select or
        slice of whole rows), in the same dtype (else the chain is not fused)."""
        tensor = self.tensor(value)
        span = byte_span(tensor)
        for _, source in reversed(self.order):
            source_span = self.spans[source]
            if self._covers(source, source_span, value, span):
                self.uses.append((self.position, source))
                self._view(value, source, source_span, span)
                return
            if source_span[0] < span[1] and span[0] < source_span[1]:
                break
        else:
            for source in dict.fromkeys(self.plan.inputs):
                meta = self.plan.values[source]
                if not isinstance(meta, P.Tensor) or meta.allocation_info is None:
                    continue  # a scalar, or read where the caller has it
                source_span = byte_span(self.tensor(source))
                if self._covers(source, source_span, value, span):
                    self._reads(source)
                    self._view(value, source, source_span, span)
                    return
        raise NotMapped(f"value {value} is read, but no instruction of the chain wrote it")

    def _writes(self, value: int) -> None:
        if value in self.produced or value in self.plan.inputs:
            raise NotMapped(f"value {value} is written twice")
        self.spans[value] = byte_span(self.tensor(value))
        self.order.append((self.position, value))
        self.produced.add(value)

    def _check_no_overwrites(self) -> None:
        """Refuse the chain if a value it reads was overwritten in memory since it was
        written: the kernels would read the new bytes, the session the old value."""
        written_at = {value: position for position, value in self.order}
        end = self.position + 1
        uses = self.uses + [(end, v) for v in self.plan.outputs if v in written_at]
        for at, value in uses:
            start, stop = self.spans[value]
            for position, other in self.order:
                if written_at[value] < position < at and other != value:
                    other_start, other_stop = self.spans[other]
                    if other_start < stop and start < other_stop:
                        raise NotMapped(f"value {value} is overwritten by value {other} "
                                        "before it is read")
