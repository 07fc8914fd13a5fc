"""Instructions (schema: union InstructionArguments, wrapped in table
Instruction), their source frames, and the chains that hold them."""

from __future__ import annotations

import array
import struct
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    _Int32s = array.array[int]
else:
    _Int32s = array.array


class Args(_Int32s):
    """A call's value indices as the reader keeps them: int32s in one block.

    A list of three indices costs ~180 bytes with its int objects, more than
    the file spends on the whole call; this costs ~100. It is a list to its
    users in all that matters: indexed, iterated, compared equal to the list
    of the same indices (a program read back equals the one written), shown
    as that list. Reading one's items makes ints, so code that reads a call's
    arguments once and keeps what it made (the runtime's steps) pays nothing
    per run for the block.
    """

    __slots__ = ()

    def __new__(cls, values: Iterable[int] = ()) -> Args:
        made: Args = super().__new__(cls, "i", values)  # type: ignore[assignment]
        return made

    @classmethod
    def unpack(cls, data: bytes | memoryview, start: int, count: int) -> Args:
        """The `count` little-endian int32s (the file's order) at `start` of `data`."""
        # From a tuple the block is exactly their size; from bytes it would have room to grow.
        return cls(struct.unpack_from(f"<{count}i", data, start))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # mutable, like the list it stands for

    def __repr__(self) -> str:
        return repr(self.tolist())

    # array's own copies and pickles come back as plain arrays
    def __copy__(self) -> Args:
        return Args(self)

    def __deepcopy__(self, memo: object) -> Args:
        return Args(self)

    def __reduce_ex__(self, protocol: object) -> tuple[type[Args], tuple[list[int]]]:
        return Args, (self.tolist(),)


@dataclass(slots=True)
class KernelCall:
    """Schema: table KernelCall. Arguments in schema order, outputs last
    (a list, or `Args` as the reader makes them)."""

    op_index: int
    args: MutableSequence[int]


@dataclass(slots=True)
class DelegateCall:
    """Schema: table DelegateCall."""

    delegate_index: int
    args: list[int]


@dataclass(slots=True)
class MoveCall:
    """Schema: table MoveCall."""

    move_from: int
    move_to: int


@dataclass(slots=True)
class JumpFalseCall:
    """Schema: table JumpFalseCall. Jumps when the Bool value is false."""

    cond_value_index: int
    destination_instruction: int


@dataclass(slots=True)
class FreeCall:
    """Schema: table FreeCall."""

    value_index: int


Instruction = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall
"""Schema: table Instruction; the member's class is the union's type tag."""

INSTRUCTION_TYPES: tuple[type, ...] = (KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall)


@dataclass(slots=True)
class Frame:
    """Schema: table Frame. One source frame of an instruction."""

    filename: str | None = None
    lineno: int = 0
    name: str | None = None
    context: str | None = None


@dataclass(slots=True)
class FrameList:
    """Schema: table FrameList. The frames of one instruction, outermost first."""

    items: list[Frame] = field(default_factory=list)


@dataclass(slots=True)
class Chain:
    """Schema: table Chain. `stacktrace` is empty or parallel to `instructions`."""

    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    stacktrace: list[FrameList] = field(default_factory=list)
