"""exirc's own metadata beside a program: versioned JSON in named-data segments.

Symbolic shapes and constant names travel in segments that `named_data`
names by key; runtimes that do not know the key ignore them. Each is one
JSON object with a `format_version`. Reading one is reading untrusted
input: too big, nested too deep (Python's parser recurses) or malformed is
a FormatError naming the segment.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from exirc.errors import FormatError

T = TypeVar("T")


def dump(content: dict[str, Any], version: int) -> bytes:
    document = {"format_version": version, **content}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def parse(data: bytes | memoryview, *, key: str, what: str, version: int, max_bytes: int,
          read: Callable[[dict[str, Any]], T]) -> T:
    """`read(document)` of the segment's JSON object. What `read` raises as
    ValueError, KeyError, TypeError or AttributeError (the shape of the JSON
    being wrong) becomes a FormatError too."""
    where = f"named_data[{key!r}]"
    if len(data) > max_bytes:
        raise FormatError(f"{what} take {len(data)} bytes, more than {max_bytes}", field=where)
    try:
        document = json.loads(bytes(data))
        if not isinstance(document, dict) or document.get("format_version") != version:
            found = document.get("format_version") if isinstance(document, dict) else None
            raise ValueError(f"format_version {found!r}, expected {version}")
        return read(document)
    except RecursionError:
        raise FormatError(f"unreadable {what}: JSON nested too deeply", field=where) from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise FormatError(f"unreadable {what}: {error}", field=where) from None
