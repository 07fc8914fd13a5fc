"""Names of a program's constants, stored beside it for reports.

A `.pte` constant is bytes at an index; the size report wants to say which
parameter they are (`encoder.layers.0.linear1.weight`), or what they were
folded from (`fc1.weight (permute_copy)`). The compiler stores, per constant
buffer index, the names of the tensors stored there (several when equal
tensors were deduplicated), as JSON in a segment named by `NAMED_DATA_KEY`,
which other runtimes ignore. This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exirc.serialize import json_segment

NAMED_DATA_KEY = "exirc.constant_names"  # a key in files: never renamed
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 24


def encode(names: Mapping[int, list[str]]) -> bytes:
    return json_segment.dump(
        {"buffers": {str(index): list(names[index]) for index in sorted(names)}}, FORMAT_VERSION)


def decode(data: bytes | memoryview) -> dict[int, list[str]]:
    """Buffer index -> names; a malformed segment is a FormatError."""
    return json_segment.parse(data, key=NAMED_DATA_KEY, what="constant names",
                              version=FORMAT_VERSION, max_bytes=_MAX_BYTES, read=_buffers)


def _buffers(document: dict[str, Any]) -> dict[int, list[str]]:
    names = {}
    for index, listed in document["buffers"].items():
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise ValueError(f"names of buffer {index} are not a list of strings")
        names[int(index)] = listed
    return names
