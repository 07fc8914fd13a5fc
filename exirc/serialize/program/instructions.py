"""Instructions (schema: union InstructionArguments, wrapped in table
Instruction), their source frames, and the chains that hold them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class KernelCall:
    """Schema: table KernelCall. Arguments in schema order, outputs last."""

    op_index: int
    args: list[int]


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
