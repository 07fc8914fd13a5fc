"""`exirc inspect --json` over huge plans: the time per entry of the plan.

A hostile or mutated file can list hundreds of thousands of arenas or
values in a few megabytes; the mutation suite inspects such files, and a
slow inspector there looks like a hang. Each row is one such file (built by
`tests/many_entries`, as the mutation `buffers_explode` makes them), run
through the command's own code in this process, its JSON written to
/dev/null with the memory and size reports (what the mutation suite asks
for). There is no reference tool: the figures to watch are the times per
entry. An arena no tensor is planned in costs about 2 us (20 us before issue
35): the 200,000-arena row is issue 35's "under 0.5 s". An arena with two
tensors costs ~200 us of CPU (~360 us before its figures were computed for
thousands of arenas at once), half of it writing its JSON; an Int value
~11 us (~22 us before), in the checked reader and the size report's walk of
the FlatBuffer.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import best_seconds
from exirc.cli.app import main
from exirc.serialize import program as P
from tests import many_entries

ARGS = ["--json", "--show", "memory", "--show", "size"]

# (what the file holds, how many entries, how to make it)
FILES: list[tuple[str, int, Callable[[int], P.Program]]] = [
    ("arenas, no tensors (buffers_explode)", 200_000, many_entries.many_buffers),
    ("arenas, each with two tensors", 5_000, many_entries.many_arena_tensors),
    ("Int values", 50_000, many_entries.many_ints),
]


def inspect_json(path: Path) -> None:
    """`exirc inspect PATH --json ...`, its output to /dev/null."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        code = main(["inspect", str(path), *ARGS])
    if code != 0:
        raise RuntimeError(f"exirc inspect {path} exited with {code}")


def run() -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as folder:
        for what, count, make in FILES:
            path = Path(folder) / "plan.pte"
            size = many_entries.write(make(count), path)
            seconds = best_seconds(functools.partial(inspect_json, path), repeat=3)
            cpu = time.process_time()  # one more run, in CPU time: a busy machine
            inspect_json(path)         # stretches the wall-clock figure, not this one
            cpu = time.process_time() - cpu
            rows.append({
                "file": what,
                "entries": count,
                "bytes": size,
                "inspect --json ms": seconds * 1e3,
                "cpu ms": cpu * 1e3,
                "us per entry": seconds * 1e6 / count,
            })
    return rows
