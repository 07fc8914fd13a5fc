"""Terminal styling: colour only on a terminal, and never with NO_COLOR."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TextIO

import click

Style = Callable[[str], str]


def use_color(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def styler(stream: TextIO, **style: Any) -> Style:
    """A function that styles text for `stream`, or leaves it plain."""
    if not use_color(stream):
        return lambda text: text
    return lambda text: click.style(text, **style)
