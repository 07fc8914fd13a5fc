"""What input files must hold, checked on their .npy headers before any data is read.

A method's signature says exactly how many bytes each input can take. The
readers in `exirc.serialize.npy` read every header first (and, in a .npz,
the archive's member names), check them all against the signature, and only
then read data. So an input of the wrong shape or dtype is refused after a
few hundred bytes, however large its header says it is: a 1 MB zip bomb
declaring a 1.25 GiB array of the wrong shape is never decompressed. What
passes is bounded by the signature, and is then read through streams that
stop at that size.

The checks and their messages are the runtime's (`exirc.runtime.core.inputs`),
applied to header shapes instead of arrays: dtype, rank and shape of each
input, then the dims shared through symbols across inputs (`symbolic_shapes`)
and their planned bounds. The runtime checks the arrays again once read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy

from exirc.errors import InputError
from exirc.serialize.io_names import default_names
from exirc.serialize.npy_header import Header
from exirc.serialize.symbolic_shapes import (
    Dim,
    InputDims,
    SymbolRange,
    check_dims,
    dim_problems_error,
)


@dataclass(frozen=True)
class ExpectedArray:
    """One input as a signature describes it."""

    name: str  # `input_0`: the key in a .npz
    signature: str  # `f32[s0<=64, 8]`: how messages show what is expected
    shape: tuple[int, ...]  # exact, or upper bounds if `at_most`
    at_most: bool = False
    # The element type, when numpy has it (bfloat16 and float8 have none:
    # then any dtype passes here and the runtime says what is wrong).
    dtype: numpy.dtype[Any] | None = None
    # Or the dtype kinds a scalar input accepts: "iu" for an int, "b" a bool.
    kinds: str | None = None
    # `s0`, `8`: the dims by symbol, if the program says; then the dims are
    # checked with the other inputs' (`ExpectedArrays.check_together`).
    symbol_dims: tuple[Dim, ...] | None = None

    def check(self, header: Header, where: str) -> None:
        """Raise InputError unless the array `header` describes fits this input
        (its symbolic dims apart). `where` (the file, or archive member) is
        not in the messages: they are the runtime's, word for word, and name
        the input, which is the member's key."""
        got = list(header.shape)
        if self.dtype is not None and header.dtype.newbyteorder("=") != self.dtype:
            raise InputError(f"{self.name} has dtype {header.dtype.name}, expected "
                             f"{self.dtype.name} ({self.signature})",
                             hint=f"convert it, e.g. array.astype(numpy.{self.dtype.name})")
        if self.kinds is not None and header.dtype.kind not in self.kinds:
            raise InputError(f"{self.name} must be a single {self.signature}, got an array of "
                             f"{header.dtype.name} from {where}")
        if len(header.shape) != len(self.shape):
            raise InputError(f"{self.name} has rank {len(got)} (shape {got}), expected rank "
                             f"{len(self.shape)} ({self.signature})")
        if self.symbol_dims is not None:
            return  # checked with the symbols, whose message names them
        for dim, (size, bound) in enumerate(zip(header.shape, self.shape)):
            if self.at_most and size > bound:
                raise InputError(f"{self.name} has shape {got}, but dim {dim} may be at most "
                                 f"{bound} ({self.signature})")
            if not self.at_most and size != bound:
                raise InputError(f"{self.name} has shape {got}, expected {list(self.shape)} "
                                 f"({self.signature})")


@dataclass(frozen=True)
class ExpectedArrays:
    """All the inputs of one method, in order, and the ranges of its symbols."""

    owner: str  # `method 'forward'`: who takes these inputs, for messages
    arrays: Sequence[ExpectedArray]
    symbols: Mapping[str, SymbolRange] = field(default_factory=dict)

    def check_keys(self, keys: Sequence[str], where: str) -> list[str]:
        """The inputs' names for `keys` (of a .npz), which must be exactly the
        inputs' names, or their positional names (`input_0`, ...: what a file
        without stored names calls them); else raise InputError."""
        expected = [array.name for array in self.arrays]
        if sorted(keys) == sorted(expected):
            return list(keys)
        positional = dict(zip(default_names(len(expected), 0).inputs, expected))
        if sorted(keys) == sorted(positional):
            return [positional[key] for key in keys]
        raise InputError(
            f"{where} has the keys {', '.join(keys) or 'none'}, but {self.owner} takes "
            f"{', '.join(expected) or 'no inputs'}",
            hint="save one array per input: numpy.savez(path, "
                 + ", ".join(f"{name}=..." for name in expected) + ")")

    def check_count(self, count: int) -> None:
        """Raise InputError unless `count` files were given, one per input."""
        if count != len(self.arrays):
            raise InputError(f"{self.owner} takes {len(self.arrays)} input"
                             f"{'' if len(self.arrays) == 1 else 's'}, got {count}",
                             hint=f"the inputs: {self.signature()}")

    def named(self, key: str) -> ExpectedArray:
        return next(array for array in self.arrays if array.name == key)

    def check_together(self, headers: Mapping[str, Header]) -> None:
        """After each header's own check: the dims of all inputs against the
        symbols (each in its range, the same wherever it appears, derived dims
        equal to their expressions) and the planned bounds, all problems at once."""
        symbolic = [(array, headers[array.name]) for array in self.arrays
                    if array.symbol_dims is not None and array.name in headers]
        _, problems = check_dims(self.symbols, [
            InputDims(array.name, array.symbol_dims, header.shape)
            for array, header in symbolic if array.symbol_dims is not None])
        if problems:
            raise dim_problems_error(problems, f"{self.owner}: {self.signature()}")
        for array, header in symbolic:
            for dim, (size, bound) in enumerate(zip(header.shape, array.shape)):
                if size > bound:  # the planned memory, whatever the symbols allow
                    raise InputError(f"{array.name} has shape {list(header.shape)}, but dim "
                                     f"{dim} may be at most {bound} ({array.signature})")

    def signature(self) -> str:
        """`input_0: f32[2, 8], input_1: int`, as the runtime writes it."""
        return ", ".join(f"{array.name}: {array.signature}" for array in self.arrays) or "none"
