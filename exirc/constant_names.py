"""Names of a program's constants, stored beside it for reports.

A `.pte` constant is bytes at an index; the size report wants to say which
parameter they are (`encoder.layers.0.linear1.weight`), or what they were
folded from (`fc1.weight (permute_copy)`). The compiler stores, per constant
buffer index, the names of the tensors stored there (several when equal
tensors were deduplicated), as JSON in a segment named by `NAMED_DATA_KEY`,
which other runtimes ignore. This module does not import torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from exirc.errors import FormatError

NAMED_DATA_KEY = "exirc.constant_names"
FORMAT_VERSION = 1
_MAX_BYTES = 1 << 24


def encode(names: Mapping[int, list[str]]) -> bytes:
    document = {"format_version": FORMAT_VERSION,
                "buffers": {str(index): list(names[index]) for index in sorted(names)}}
    return json.dumps(document, separators=(",", ":")).encode()


def decode(data: bytes | memoryview) -> dict[int, list[str]]:
    """Buffer index -> names; a malformed segment is a FormatError."""
    where = f"named_data[{NAMED_DATA_KEY!r}]"
    if len(data) > _MAX_BYTES:
        raise FormatError(f"constant names take {len(data)} bytes, more than {_MAX_BYTES}",
                          field=where)
    try:
        document = json.loads(bytes(data))
        if document.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {document.get('format_version')!r}")
        names = {}
        for index, listed in document["buffers"].items():
            if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
                raise ValueError(f"names of buffer {index} are not a list of strings")
            names[int(index)] = listed
        return names
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise FormatError(f"unreadable constant names: {error}", field=where) from None
