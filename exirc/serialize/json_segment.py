"""exirc's own metadata beside a program: versioned JSON in named-data segments.

Symbolic shapes and constant names travel in segments that `named_data`
names by key; runtimes that do not know the key ignore them. Each is one
JSON object with a `format_version`, stored zlib-compressed: names and module
paths repeat their prefixes, so compression takes about three quarters off
the segments, and packing (`DataSegment.packed`) their padding. Files written
before that hold the plain JSON, which starts with `{` where a zlib stream
cannot, and still read.
Reading one is reading untrusted input: too big (before or after
decompressing: a small stream can expand without bound), nested too deep
(Python's parser recurses) or malformed is a FormatError naming the segment.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from exirc.errors import FormatError

T = TypeVar("T")


def dump(content: dict[str, Any], version: int, *, dictionary: bytes = b"") -> bytes:
    """The segment of `content`. A preset `dictionary` (zlib's: text the
    stream may refer back to as if it came first) lets a small segment cost
    little more than what is particular to it; such a stream is raw deflate,
    without zlib's header and checksum (10 bytes of a segment of 60): its
    key says how it is stored, and a damaged one is still refused (broken
    stream, bytes after its end, or not the JSON expected)."""
    document = {"format_version": version, **content}
    deflate = zlib.compressobj(9, wbits=-15, zdict=dictionary) if dictionary \
        else zlib.compressobj(9)
    text = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return deflate.compress(text) + deflate.flush()


def parse(data: bytes | memoryview, *, key: str, what: str, version: int, max_bytes: int,
          read: Callable[[dict[str, Any]], T], dictionary: bytes = b"") -> T:
    """`read(document)` of the segment's JSON object. What `read` raises as
    ValueError, KeyError, TypeError or AttributeError (the shape of the JSON
    being wrong) becomes a FormatError too."""
    where = f"named_data[{key!r}]"
    if len(data) > max_bytes:
        raise FormatError(f"{what} take {len(data)} bytes, more than {max_bytes}", field=where)
    try:
        document = json.loads(json_text(data, max_bytes, dictionary))
        if not isinstance(document, dict) or document.get("format_version") != version:
            found = document.get("format_version") if isinstance(document, dict) else None
            raise ValueError(f"format_version {found!r}, expected {version}")
        return read(document)
    except RecursionError:
        raise FormatError(f"unreadable {what}: JSON nested too deeply", field=where) from None
    except (ValueError, KeyError, TypeError, AttributeError, zlib.error) as error:
        raise FormatError(f"unreadable {what}: {error}", field=where) from None


def json_text(data: bytes | memoryview, max_bytes: int, dictionary: bytes = b"") -> bytes:
    """The segment's JSON: as stored by older files, or decompressed, at most
    `max_bytes` of it (ValueError past that, zlib.error for a broken stream).
    With a `dictionary` the stream is raw deflate (`dump`), never plain JSON."""
    raw = bytes(data)
    if raw[:1] == b"{" and not dictionary:
        return raw
    inflate = zlib.decompressobj(wbits=-15, zdict=dictionary) if dictionary \
        else zlib.decompressobj()
    text = inflate.decompress(raw, max_bytes + 1)
    if len(text) > max_bytes:
        raise ValueError(f"more than {max_bytes} bytes once decompressed")
    if not inflate.eof or inflate.unused_data:
        raise ValueError("the compressed stream is truncated or has bytes after its end")
    return text
