"""Mutations of the file's bytes, below the program model: what a disk, a
download or an attacker does. Most land in the FlatBuffer (the first part of
the file), where offsets and lengths a reader must check live.
"""

from __future__ import annotations

import random

from tools.mutants.context import byte_kind

_WORDS = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
          0xFFFFFFFF, 0xFFFFFFFE, 0x10000]


def _position(data: bytes, rng: random.Random) -> int:
    """Mostly inside the first 4 KiB (the FlatBuffer tables), sometimes anywhere."""
    limit = len(data) if rng.random() < 0.3 else min(len(data), 4096)
    return rng.randrange(max(limit, 1))


@byte_kind("byte_flip")
def byte_flip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    flips = []
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        position = _position(data, rng)
        bit = rng.randrange(8)
        out[position] ^= 1 << bit
        flips.append(f"{position}.{bit}")
    return bytes(out), "bit flips at " + ", ".join(flips)


@byte_kind("byte_word")
def byte_word(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """An aligned 32-bit word (an offset, a length, a count) set to an edge value."""
    out = bytearray(data)
    position = _position(data, rng) & ~3
    word = rng.choice(_WORDS + [len(data), len(data) - position])
    out[position:position + 4] = (word & 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(out[:len(data)]), f"word at {position} = {word:#x}"


@byte_kind("byte_cut")
def byte_cut(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """The file is truncated, or a range of it removed, zeroed, repeated or inserted."""
    start = _position(data, rng)
    length = rng.choice([1, 4, 16, 256, len(data)])
    action = rng.choice(["truncate", "delete", "zero", "repeat", "insert"])
    if action == "truncate":
        return data[:start], f"truncated to {start} bytes"
    end = min(len(data), start + length)
    if action == "delete":
        return data[:start] + data[end:], f"deleted bytes {start}:{end}"
    if action == "zero":
        return data[:start] + bytes(end - start) + data[end:], f"zeroed bytes {start}:{end}"
    if action == "repeat":
        return data[:end] + data[start:end] + data[end:], f"repeated bytes {start}:{end}"
    noise = bytes(rng.randrange(256) for _ in range(min(length, 64)))
    return data[:start] + noise + data[start:], f"inserted {len(noise)} bytes at {start}"
