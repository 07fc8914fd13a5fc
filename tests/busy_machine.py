"""A busy machine on demand: processes that burn CPU beside a test.

Issue 35: verdicts that a loaded machine alone could change (a mutant killed
as hung, a loop stopped by a clock) are gone; the tests that say so run
their case beside `busy_neighbours()`, which keeps every core busy, as
another engineer's build or test run would.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

_SPIN = "while True: pass"


@contextlib.contextmanager
def busy_neighbours(count: int | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` processes (one per core by default) spinning at full priority
    for the block's duration; killed when it ends."""
    count = (os.cpu_count() or 2) if count is None else count
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(timeout=120)
