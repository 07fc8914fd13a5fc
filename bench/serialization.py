"""Reading and writing .pte files: exirc against ExecuTorch's own serializer.

Per reference model: the time to read ExecuTorch's file into a program
object (exirc's checked reader vs ExecuTorch's `deserialize_pte_binary`),
and to write it back (exirc's `serialize` vs `serialize_pte_binary`).
"""

from __future__ import annotations

import functools
from typing import Any

from bench.common import best_seconds, ratio
from exirc.serialize import deserialize
from exirc.serialize.writer import serialize
from tests.oracle import HAVE_EXECUTORCH, MODEL_NAMES, executorch_pte, executorch_read


def run() -> list[dict[str, Any]]:
    if not HAVE_EXECUTORCH:
        return [{"note": "ExecuTorch not installed: nothing to compare against"}]
    from executorch.exir._serialize._program import serialize_pte_binary

    rows = []
    for name in MODEL_NAMES:
        data, _ = executorch_pte(name)
        ours_program = deserialize(data)
        theirs_file = executorch_read(data)
        read_ours = best_seconds(functools.partial(deserialize, data))
        read_theirs = best_seconds(functools.partial(executorch_read, data))
        write_ours = best_seconds(functools.partial(serialize, ours_program))
        write_theirs = best_seconds(functools.partial(serialize_pte_binary, theirs_file))
        rows.append({
            "model": name,
            "bytes": len(data),
            "read exirc us": read_ours * 1e6,
            "read ET us": read_theirs * 1e6,
            "read ratio": ratio(read_ours, read_theirs),
            "write exirc us": write_ours * 1e6,
            "write ET us": write_theirs * 1e6,
            "write ratio": ratio(write_ours, write_theirs),
        })
    return rows
