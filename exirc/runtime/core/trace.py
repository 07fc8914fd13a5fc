"""A profile's timeline as a Chrome trace (the trace-event JSON format that
chrome://tracing and ui.perfetto.dev open).

One "X" (complete) slice per run, and inside it one per instruction run,
named by its operator, with its source line, module, chain and index as
arguments; times are microseconds from the start of the first run. Events
are written one per line as they are formatted, so a trace of 200,000
slices needs no second copy of itself in memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

from exirc.runtime.core.profile import Profile

_PID = 1
_TID = 1
_CHUNK = 10_000  # slices formatted per write


def write_chrome_trace(file: BinaryIO, profile: Profile, runs: Sequence[tuple[float, float]],
                       names: Mapping[str, str], about: Mapping[str, Any]) -> int:
    """Write the trace of `runs` ((start, end) `perf_counter` times of the runs
    on `profile`'s timeline) to `file`; return the instruction slices written.

    `names` gives the trace's "process" and "thread" names (the program, the
    method); `about` goes into the trace's `otherData`."""
    origin = runs[0][0] if runs else 0.0
    # Each instruction's name and arguments, encoded once however often it ran.
    heads = [f'{{"name":{json.dumps(slot.site.label)},"cat":"instruction","ph":"X",'
             f'"pid":{_PID},"tid":{_TID},"args":'
             + json.dumps({"source": slot.site.source,
                           "module": getattr(slot.site, "module", ""),
                           "chain": slot.site.chain, "index": slot.site.index})
             for slot in profile.instructions]
    events = [json.dumps({"name": f"{kind}_name", "ph": "M", "pid": _PID, "tid": _TID,
                          "args": {"name": names.get(kind, "")}}) for kind in ("process", "thread")]
    events += [f'{{"name":"run {number}","cat":"run","ph":"X","pid":{_PID},"tid":{_TID},'
               f'"ts":{_micros(start - origin)},"dur":{_micros(end - start)},'
               f'"args":{{"run":{number}}}}}' for number, (start, end) in enumerate(runs, 1)]
    file.write(b'{"displayTimeUnit":"ms","otherData":' + json.dumps(dict(about)).encode()
               + b',\n"traceEvents":[\n' + ",\n".join(events).encode())
    slices = profile.timeline or []
    for first in range(0, len(slices), _CHUNK):
        chunk = slices[first:first + _CHUNK]
        file.write("".join(f',\n{heads[number]},"ts":{_micros(start - origin)},'
                           f'"dur":{_micros(end - start)}}}'
                           for number, start, end in chunk).encode())
    file.write(b"\n]}\n")
    return len(slices)


def _micros(seconds: float) -> str:
    """Seconds as microseconds with nanosecond digits, never negative."""
    return f"{max(seconds, 0.0) * 1e6:.3f}"
