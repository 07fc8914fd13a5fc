"""The external data file (`.ptd`): tensors and delegate weights by name.

A program compiled with external weights keeps each weight's bytes in a data
file beside it, ExecuTorch's flat tensor format (file identifier `FT01`): the
program's tensor says `location EXTERNAL` and a name, and the data file maps
names to bytes, with the tensor's layout so a loader can check it before use.
Delegates look their weights up by name in the same map. Two programs may
read one data file.

`write_data_file` and `read_data_file` turn a `DataFile` into bytes and back;
the reader checks every offset, size and layout, raising `FormatError`.
This package does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exirc.serialize import program as P


@dataclass(frozen=True)
class TensorLayout:
    """What a tensor stored by name is: its dtype, sizes and dim order."""

    scalar_type: P.ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.sizes:
            count *= size
        return count * self.scalar_type.itemsize

    @classmethod
    def of(cls, tensor: P.Tensor) -> TensorLayout:
        dim_order = tuple(tensor.dim_order) or tuple(range(len(tensor.sizes)))
        return cls(tensor.scalar_type, tuple(tensor.sizes), dim_order)

    def __str__(self) -> str:
        return f"{self.scalar_type.name.lower()}{list(self.sizes)}"


@dataclass(frozen=True)
class Stored:
    """One named entry: its bytes, and its layout when it is a program's tensor."""

    data: bytes | memoryview
    layout: TensorLayout | None = None


@dataclass
class DataFile:
    """Named data, in the order it is written; equal bytes are stored once."""

    entries: dict[str, Stored] = field(default_factory=dict)
    version: int = 0

    def add(self, key: str, data: bytes | memoryview, layout: TensorLayout | None = None) -> None:
        self.entries[key] = Stored(data, layout)

    def get(self, key: str) -> Stored | None:
        return self.entries.get(key)


FILE_IDENTIFIER = b"FT01"
VERSION = 0  # the newest version this reader understands (ExecuTorch 1.5.1 writes 0)
