"""How capture's error messages quote what they found.

An exception's first line and a value's kind, worded the same way by every
loader and by capture itself.
"""

from __future__ import annotations

from typing import Any

import torch


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's text, or its type name."""
    for line in str(error).splitlines():
        if line.strip():
            return shorten(line.strip(), 300)
    return type(error).__name__


def shorten(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else cut after its last whole
    sentence that fits (or its last whole word, then "..."), never mid-word."""
    if len(text) <= limit:
        return text
    head = text[:limit - 3]
    sentence = head.rfind(". ")
    if sentence >= limit // 3:
        return head[:sentence + 1]
    word = head.rfind(" ")
    return (head[:word] if word > 0 else head).rstrip(" ,;:") + "..."


def describe(value: Any) -> str:
    """`a str ('x')`, `a Tensor of shape (2, 3)`, `None`: what was found, for messages."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {tuple(value.shape)}"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if isinstance(value, (str, int, float, bool)):
        text = repr(value)
        return f"{article} {kind} ({text if len(text) <= 40 else text[:37] + '...'})"
    if isinstance(value, (tuple, list, dict)):
        return f"{article} {kind} of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"{article} {kind}"
