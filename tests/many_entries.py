"""Generators of valid programs with very many entries, and a peak-memory probe.

A small file can describe a great many things: half a million Int values,
two hundred thousand arenas, as many instructions. The reader, the runtime's
loader and the inspector must cost memory in proportion to the file (issue
16 aims at a peak of at most 4 x the file size + 16 MiB above what importing
costs). These builders make such files with the checked writer: every index
is in range, so only the amount of work is hostile.

`peak_growth(imports, body)` runs Python code in a fresh process and returns
how far its peak resident memory rose above the resident memory after the
imports (the peak is reset there: /proc/self/clear_refs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from exirc.serialize import program as P
from exirc.serialize import serialize
from tests.shared_files import shared, shared_folder

MIB = 1 << 20


def budget(file_size: int) -> int:
    """Peak growth issue 16 aims at for a file of `file_size` bytes."""
    return 4 * file_size + 16 * MIB


def _planned(offset: int, sizes: list[int], memory_id: int = 1) -> P.Tensor:
    return P.Tensor(P.ScalarType.FLOAT, sizes, list(range(len(sizes))),
                    allocation_info=P.AllocationDetails.at(memory_id, offset))


def _program(plan: P.ExecutionPlan) -> P.Program:
    return P.Program(execution_plan=[plan])


def many_ints(count: int) -> P.Program:
    """`count` Int values (large ones: each its own int object) and a relu."""
    values: list[P.EValue] = [_planned(0, [4]), _planned(16, [4])]
    values.extend(P.Int(1000 + i) for i in range(count))
    chain = P.Chain([0], [1], [P.KernelCall(0, [0, 1, 1])])
    return _program(P.ExecutionPlan(
        "forward", values, [0], [1], [chain], [P.Operator("aten::relu", "out")],
        non_const_buffer_sizes=[0, 32]))


def many_buffers(count: int, instructions: int = 1) -> P.Program:
    """`count` planned arenas of 16 bytes besides buffer 1, and `instructions` relus."""
    values: list[P.EValue] = [_planned(0, [4]), _planned(16, [4])]
    chain = P.Chain([0], [1], [P.KernelCall(0, [0, 1, 1]) for _ in range(instructions)])
    return _program(P.ExecutionPlan(
        "forward", values, [0], [1], [chain], [P.Operator("aten::relu", "out")],
        non_const_buffer_sizes=[0, 32] + [16] * count))


def many_tensors(count: int) -> P.Program:
    """`count` planned f32[4] tensors side by side in buffer 1; a relu of the first two."""
    values: list[P.EValue] = [_planned(16 * i, [4]) for i in range(count)]
    chain = P.Chain([0], [1], [P.KernelCall(0, [0, 1, 1])])
    return _program(P.ExecutionPlan(
        "forward", values, [0], [1], [chain], [P.Operator("aten::relu", "out")],
        non_const_buffer_sizes=[0, 16 * count]))


def many_instructions(count: int) -> P.Program:
    """`count` relus between two tensors, each with a one-frame stack trace."""
    values: list[P.EValue] = [_planned(0, [4]), _planned(16, [4])]
    frames = P.FrameList([P.Frame("model.py", 7, "forward", "return x.relu()")])
    chain = P.Chain([0], [1], [P.KernelCall(0, [0, 1, 1]) for _ in range(count)],
                    [frames] * count)
    return _program(P.ExecutionPlan(
        "forward", values, [0], [1], [chain], [P.Operator("aten::relu", "out")],
        non_const_buffer_sizes=[0, 32]))


def many_arena_tensors(count: int) -> P.Program:
    """`count` arenas, each with an input and an output tensor that one relu of
    `count` uses (memory report: an arena live at each position)."""
    values: list[P.EValue] = []
    for memory_id in range(1, count + 1):
        values += [_planned(0, [4], memory_id), _planned(16, [4], memory_id)]
    chain = P.Chain([0], [1], [P.KernelCall(0, [2 * i, 2 * i + 1, 2 * i + 1])
                               for i in range(count)])
    return _program(P.ExecutionPlan(
        "forward", values, [0], [1], [chain], [P.Operator("aten::relu", "out")],
        non_const_buffer_sizes=[0] + [32] * count))


# Big enough that a cost per entry above linear shows (a quadratic one by
# orders of magnitude), small enough that make test probes each in seconds;
# test_load_memory reads half a million values once more, the reader alone.
GENERATORS = {
    "ints": lambda: many_ints(250_000),
    "buffers": lambda: many_buffers(100_000),
    "tensors": lambda: many_tensors(100_000),
    "instructions": lambda: many_instructions(100_000),
    "arenas": lambda: many_arena_tensors(50_000),
}

# Python holds a planned tensor as a Tensor, its AllocationDetails and two
# lists (~350 bytes) where the file needs ~64: files of little else cost the
# reader ~5.5x their size, past the 4x aim (see `TENSOR_HEAVY_FACTOR`).
TENSOR_HEAVY = frozenset({"tensors", "arenas"})
TENSOR_HEAVY_FACTOR = 8


def budget_for(name: str, file_size: int) -> int:
    """The peak growth allowed for generated file `name`."""
    factor = TENSOR_HEAVY_FACTOR if name in TENSOR_HEAVY else 4
    return factor * file_size + 16 * MIB


def make_files(directory: Path) -> dict[str, tuple[Path, int]]:
    """Every generated program written to `directory`: name -> (path, size)."""
    files = {}
    for name, make in GENERATORS.items():
        path = directory / f"{name}.pte"
        files[name] = (path, write(make(), path))
    return files


def shared_files() -> dict[str, tuple[Path, int]]:
    """`make_files`, once per test run (`tests.shared_files`): the modules that read
    these files, and the xdist workers that run them, share one set (writing it
    costs ~10 s)."""
    return shared("many entries: the generated files",
                  lambda: make_files(shared_folder("many entries")))


def write(program: P.Program, path: Path) -> int:
    """Write `program` to `path`; its size in bytes."""
    data = serialize(program)
    path.write_bytes(data)
    return len(data)


_PROBE = """
import json, resource, sys
def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(key)
{imports}
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak so far (importing) is not the body's
_base = _status("VmRSS")
{body}
print(json.dumps({{"base": _base, "peak": _status("VmHWM")}}), file=sys.stderr)
"""


def peak_growth(imports: str, body: str) -> int:
    """Run `imports` then `body` in a fresh Python; bytes its peak RSS rose above
    the resident memory after `imports`. `body` must not print to stderr."""
    code = _PROBE.format(imports=textwrap.dedent(imports), body=textwrap.dedent(body))
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=600, check=False,
                          env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stderr.strip().splitlines()[-1])
    return int(figures["peak"]) - int(figures["base"])


def cli_peak_growth(args: list[str]) -> int:
    """`peak_growth` of the real command line `exirc ARGS` (stdout discarded),
    above the resident memory after it ran once, with the same views, on a tiny
    program: the CLI imports a command's modules when it runs, and what running
    imports on first use is not the file's cost."""
    imports = f"""
    import os, tempfile
    from exirc.cli.app import main
    from exirc.serialize import serialize
    from tests.programs import add_constant_program
    tiny = os.path.join(tempfile.mkdtemp(), "tiny.pte")
    with open(tiny, "wb") as file:
        file.write(serialize(add_constant_program()))
    assert main([{args[0]!r}, tiny, *{args[2:]!r}]) == 0
    """
    body = f"""
    code = main({args!r})
    assert code == 0, f"exit code {{code}}"
    """
    return peak_growth(imports, body)


def load_peak_growth(path: Path) -> int:
    """`peak_growth` of `exirc.runtime.load(path)`, after a first load of a tiny
    program (what loading imports on first use is not the file's cost)."""
    imports = """
    import exirc.runtime
    from exirc.serialize import serialize
    from tests.programs import add_constant_program
    exirc.runtime.load(serialize(add_constant_program()))
    """
    return peak_growth(imports, f"exirc.runtime.load({str(path)!r})")
