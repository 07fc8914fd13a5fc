"""`exirc compile`'s progress: a line on stderr as each stage finishes.

A compile can take minutes; a terminal that says nothing until the end looks
hung. Lines are appended, not redrawn, so they read the same in a log. Only
for a person watching: stderr must be a terminal, and `-q` and `--json` turn
it off. EXIRC_PROGRESS=1 (or 0) turns it on (or off) wherever stderr goes,
short of -q and --json.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO

from exirc.cli.style import styler

StageListener = Callable[[str, float], None]


def wants_progress(stream: TextIO, *, quiet: bool, as_json: bool) -> bool:
    """Whether to print progress on `stream` (stderr)."""
    if quiet or as_json:
        return False
    forced = os.environ.get("EXIRC_PROGRESS", "")
    if forced in ("0", "1"):
        return forced == "1"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def stage_printer(stream: TextIO | None = None) -> StageListener:
    """A listener printing `  capture ....... 2.46 s` per finished stage on `stream`."""
    out = stream if stream is not None else sys.stderr
    dim = styler(out, dim=True)

    def print_stage(stage: str, seconds: float) -> None:
        out.write(dim(f"  {stage + ' ':.<16} {seconds:6.2f} s") + "\n")
        out.flush()
    return print_stage
