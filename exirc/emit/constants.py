"""The program's constant data: each distinct tensor stored once.

Deduplication is by content (the bytes, whatever the dtype and shape the
tensors reading them give them), across all methods, so a weight shared by
two methods, or two equal folded constants, costs its bytes once in the
file. The initial values of program state are deduplicated the same way
(the zeros of a KV cache's keys and values are one buffer), and named data
a delegate reads can point at a constant buffer holding its bytes
(`stored_at`) instead of storing them again.
"""

from __future__ import annotations

import hashlib

import torch

from exirc.serialize import constant_names
from exirc.serialize import program as P


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def content_key(data: bytes) -> tuple[int, bytes]:
    """What two buffers with the same bytes have in common: their length and sha256."""
    return len(data), hashlib.sha256(data).digest()


class ConstantTable:
    def __init__(self) -> None:
        # Buffer 0 is reserved: data_buffer_idx 0 means "no constant data".
        self.buffers: list[bytes] = [b""]
        self._index: dict[tuple[int, bytes], int] = {}
        # Buffer index -> the names of the tensors stored there, for reports.
        self.names: dict[int, list[str]] = {}
        # Initial values of program state (`exirc.ir.state`), one per state name,
        # in ExecuTorch's mutable data segment; entry 0 is reserved likewise.
        self.initial_states: list[bytes] = [b""]
        self._state_index: dict[str, int] = {}
        self._state_layout: dict[str, tuple[tuple[int, ...], str]] = {}
        self._state_content: dict[tuple[int, bytes], int] = {}
        # Once attached: the constant segment's index and each buffer's offset in it.
        self._segment: int | None = None
        self._offsets: list[int] = []

    def add(self, tensor: torch.Tensor, name: str | None = None) -> int:
        data = tensor_bytes(tensor)
        key = content_key(data)
        index = self._index.get(key)
        if index is None:
            index = len(self.buffers)
            self.buffers.append(data)
            self._index[key] = index
        if name and name not in self.names.setdefault(index, []):
            self.names[index].append(name)
        return index

    def add_state(self, tensor: torch.Tensor, name: str, layout: str = "") -> int:
        """The index of state `name`'s initial value (`tensor`) in the mutable segment.

        States with equal initial values share an entry: each is copied into
        its own planned memory when a method loads."""
        seen = self._state_layout.setdefault(name, (tuple(tensor.shape), layout))
        if seen != (tuple(tensor.shape), layout):
            from exirc.ir.state import StateLayoutError

            raise StateLayoutError(f"the methods read state {name!r} in two layouts: "
                                   f"{list(seen[0])} ({seen[1]}) and {list(tensor.shape)} "
                                   f"({layout})")
        index = self._state_index.get(name)
        if index is None:
            data = tensor_bytes(tensor)
            key = content_key(data)
            index = self._state_content.get(key)
            if index is None:
                index = len(self.initial_states)
                self.initial_states.append(data)
                self._state_content[key] = index
            self._state_index[name] = index
        return index

    def drop_constants(self) -> None:
        """Forget the constant buffers (their tensors were moved to an external
        data file, `exirc.emit.external`); initial values of state stay."""
        self.buffers = [b""]
        self._index = {}
        self.names = {}

    def stored_at(self, data: bytes) -> tuple[int, int] | None:
        """(segment index, offset) of a constant buffer holding exactly `data`,
        once attached; None if there is none (or `data` is empty)."""
        index = self._index.get(content_key(data)) if data else None
        if index is None or self._segment is None:
            return None
        return self._segment, self._offsets[index]

    def attach(self, program: P.Program) -> None:
        """Store the buffers as the program's constant segment.

        A program without constants still gets a constant segment holding
        the reserved entry: ExecuTorch's runtime reads a file with segments
        but no constant offsets as the deprecated inline constant_buffer
        layout, which its builds no longer support.
        """
        segment, offsets = P.pack_subsegments(self.buffers, P.CONSTANT_ALIGNMENT)
        self._segment, self._offsets = len(program.segments), offsets
        program.constant_segment = P.SubsegmentOffsets(len(program.segments), offsets)
        program.segments.append(P.DataSegment(segment))
        if len(self.initial_states) > 1:
            segment, offsets = P.pack_subsegments(self.initial_states, P.CONSTANT_ALIGNMENT)
            program.mutable_data_segments = [P.SubsegmentOffsets(len(program.segments), offsets)]
            program.segments.append(P.DataSegment(segment))
        if self.names:
            program.add_named_segment(constant_names.NAMED_DATA_KEY,
                                      constant_names.encode(self.names), packed=True)
