"""The program's constant data: each distinct tensor stored once.

Deduplication is by content (dtype and bytes), across all methods, so a
weight shared by two methods, or two equal folded constants, costs its bytes
once in the file.
"""

from __future__ import annotations

import hashlib

import torch

from exirc.serialize import constant_names
from exirc.serialize import program as P


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


class ConstantTable:
    def __init__(self) -> None:
        # Buffer 0 is reserved: data_buffer_idx 0 means "no constant data".
        self.buffers: list[bytes] = [b""]
        self._index: dict[tuple[str, bytes], int] = {}
        # Buffer index -> the names of the tensors stored there, for reports.
        self.names: dict[int, list[str]] = {}
        # Initial values of program state (`exirc.ir.state`), one per state name,
        # in ExecuTorch's mutable data segment; entry 0 is reserved likewise.
        self.initial_states: list[bytes] = [b""]
        self._state_index: dict[str, int] = {}

    def add(self, tensor: torch.Tensor, name: str | None = None) -> int:
        data = tensor_bytes(tensor)
        key = (str(tensor.dtype), hashlib.sha256(data).digest())
        index = self._index.get(key)
        if index is None:
            index = len(self.buffers)
            self.buffers.append(data)
            self._index[key] = index
        if name and name not in self.names.setdefault(index, []):
            self.names[index].append(name)
        return index

    def add_state(self, tensor: torch.Tensor, name: str) -> int:
        """The index of state `name`'s initial value (`tensor`) in the mutable segment."""
        index = self._state_index.get(name)
        if index is None:
            index = len(self.initial_states)
            self.initial_states.append(tensor_bytes(tensor))
            self._state_index[name] = index
        return index

    def attach(self, program: P.Program) -> None:
        """Store the buffers as the program's constant segment.

        A program without constants still gets a constant segment holding
        the reserved entry: ExecuTorch's runtime reads a file with segments
        but no constant offsets as the deprecated inline constant_buffer
        layout, which its builds no longer support.
        """
        segment, offsets = P.pack_subsegments(self.buffers, P.CONSTANT_ALIGNMENT)
        program.constant_segment = P.SubsegmentOffsets(len(program.segments), offsets)
        program.segments.append(P.DataSegment(segment))
        if len(self.initial_states) > 1:
            segment, offsets = P.pack_subsegments(self.initial_states, P.CONSTANT_ALIGNMENT)
            program.mutable_data_segments = [P.SubsegmentOffsets(len(program.segments), offsets)]
            program.segments.append(P.DataSegment(segment))
        if self.names:
            program.add_named_segment(constant_names.NAMED_DATA_KEY,
                                      constant_names.encode(self.names))
