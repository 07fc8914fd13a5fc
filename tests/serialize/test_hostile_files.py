"""The checked reader against hostile files.

`deserialize` must, for any bytes whatsoever, either return a Program or
raise `FormatError`: never another exception, never hang, never allocate
more than the file justifies. `exirc inspect` must turn the same files into
exit code 0 or 3 with a one-line error, never a traceback.

The mutation tests are seeded: a failure prints the base file, the mutation
index and a description of the mutation; `_mutate(base, index)` rebuilds
the exact file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
import traceback
import tracemalloc
from pathlib import Path

import pytest

from exirc.cli.app import main
from exirc.errors import FormatError
from exirc.serialize import deserialize
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.programs import without_metadata_segment
from tests.serialize import hostile as H

ST = P.ScalarType
# CPU seconds per file: a busy machine does not stretch CPU time (it would
# stretch wall-clock time), so only a reader doing too much work fails.
CPU_LIMIT = 1.0

# ==========================================================================
# Harness
# ==========================================================================


class _Deadline(BaseException):
    """Raised by the watchdog; a BaseException so no `except Exception` in
    the reader can turn a hang into a FormatError."""


@contextlib.contextmanager
def _watchdog(seconds: float):
    """Interrupt the block once the process has spent `seconds` of CPU time in
    it (ITIMER_PROF; pure-Python loops only)."""

    def fire(signum, frame):
        raise _Deadline(f"still running after {seconds} s of CPU time")

    old = signal.signal(signal.SIGPROF, fire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def _read(data) -> tuple[str, object, float]:
    """Deserialize under a watchdog: ("ok", program | "format", error |
    "other", exception | "hang", None), CPU seconds."""
    start = time.process_time()
    try:
        with _watchdog(10 * CPU_LIMIT):
            result = deserialize(data)
    except FormatError as exc:
        return "format", exc, time.process_time() - start
    except _Deadline:
        return "hang", None, time.process_time() - start
    except BaseException as exc:  # noqa: BLE001 - any other exception is the bug
        return "other", exc, time.process_time() - start
    return "ok", result, time.process_time() - start


def _expect_format_error(data, *, fields: tuple[str, ...] = (), pattern: str | None = None
                         ) -> FormatError:
    """Assert `data` is rejected with FormatError in time; return the error.

    `fields`: the message must contain at least one of these (the offending
    field's name). `pattern`: ... or match this regex.
    """
    outcome, value, seconds = _read(data)
    if outcome == "other":
        tb = "".join(traceback.format_exception(value))
        pytest.fail(f"raised {type(value).__name__} instead of FormatError:\n{tb}")
    assert outcome != "hang", "deserialize did not finish within 10 s of CPU time"
    assert outcome == "format", f"accepted a malformed file: {value!r}"[:2000]
    assert seconds < CPU_LIMIT, f"took {seconds:.2f} s of CPU time to reject"
    message = str(value)
    assert "Traceback" not in message
    if fields or pattern:
        named = any(f.lower() in message.lower() for f in fields)
        matched = bool(pattern and re.search(pattern, message, re.IGNORECASE))
        assert named or matched, (
            f"FormatError message does not name the field (expected one of {fields}"
            f"{' or /' + pattern + '/' if pattern else ''}): {message!r}")
    return value


def _encode(program: P.Program) -> bytes:
    return H.encode(program).data


def _broken_invariant(program) -> str | None:
    """What an accepted program promises its users (interpreter, inspector):
    every index in range and every tensor backed by enough bytes. None when
    all hold."""
    if not isinstance(program, P.Program):
        return f"returned {type(program).__name__}, not a Program"
    for p, plan in enumerate(program.execution_plan):
        for v, value in enumerate(plan.values):
            if not isinstance(value, P.Tensor):
                continue
            where = f"execution_plan[{p}].values[{v}]"
            nbytes = value.nbytes
            if value.data_buffer_idx:
                if not value.data_buffer_idx < program.constant_count():
                    return f"{where}.data_buffer_idx {value.data_buffer_idx} out of range"
                have = len(program.constant_data(value.data_buffer_idx))
                if have < nbytes:
                    return (f"{where}: constant tensor of {nbytes} bytes, but "
                            f"constant_data({value.data_buffer_idx}) has {have}")
            if value.allocation_info is not None:
                info = value.allocation_info
                sizes = plan.non_const_buffer_sizes
                if not 0 <= info.memory_id < len(sizes):
                    return f"{where}.allocation_info.memory_id {info.memory_id} out of range"
                if info.offset + nbytes > sizes[info.memory_id]:
                    return f"{where}: planned tensor overruns its buffer"
        for c, chain in enumerate(plan.chains):
            for i, instr in enumerate(chain.instructions):
                if isinstance(instr, P.KernelCall) and not (
                        0 <= instr.op_index < len(plan.operators)):
                    return f"chains[{c}].instructions[{i}].op_index out of range"
    return None


# ==========================================================================
# Base files
# ==========================================================================

BASE_NAMES = sorted(H.BASE_PROGRAMS)


def _base_file(key: str) -> bytes:
    """`name/exirc` (exirc's writer) or `name/raw` (the test's own writer)."""
    name, writer = key.split("/")
    program = H.BASE_PROGRAMS[name]()
    return serialize(program) if writer == "exirc" else _encode(program)


BASE_KEYS = [f"{name}/{writer}" for name in BASE_NAMES for writer in ("exirc", "raw")]


def _normalized(program: P.Program) -> P.Program:
    """Segment data as bytes (a reader may return memoryviews), without the
    metadata segment the writer adds."""
    program = without_metadata_segment(program)
    return dataclasses.replace(
        program, segments=[P.DataSegment(bytes(s.data)) for s in program.segments])


@pytest.mark.parametrize("key", BASE_KEYS)
def test_base_file_round_trips(key: str) -> None:
    data = _base_file(key)
    outcome, value, seconds = _read(data)
    assert outcome == "ok", f"{key}: valid base file not read: {value!r}"
    expected = H.BASE_PROGRAMS[key.split("/")[0]]()
    assert _normalized(value) == _normalized(expected)
    assert seconds < CPU_LIMIT


@pytest.mark.parametrize("name", BASE_NAMES)
def test_base_file_reads_from_path_and_memoryview(name: str, tmp_path: Path) -> None:
    data = serialize(H.BASE_PROGRAMS[name]())
    path = tmp_path / f"{name}.pte"
    path.write_bytes(data)
    expected = _normalized(H.BASE_PROGRAMS[name]())
    assert _normalized(deserialize(path)) == expected
    assert _normalized(deserialize(memoryview(data))) == expected
    assert _normalized(deserialize(bytearray(data))) == expected


def test_non_contiguous_memoryview() -> None:
    data = serialize(H.minimal())
    spread = bytes(x for byte in data for x in (byte, 0))
    view = memoryview(spread)[::2]
    assert bytes(view) == data
    outcome, value, _ = _read(view)
    assert outcome in ("ok", "format"), repr(value)


@pytest.mark.parametrize("name", BASE_NAMES)
def test_base_file_inspects(name: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / f"{name}.pte"
    path.write_bytes(serialize(H.BASE_PROGRAMS[name]()))
    for extra in ([], ["--json"], ["--show", "instructions"]):
        assert main(["inspect", str(path), *extra]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert out.strip()
        if extra == ["--json"]:
            json.loads(out)


# ==========================================================================
# Seeded mutations
# ==========================================================================

SPECIAL_U32 = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFC, 0xFFFFFFF8,
               0xFFFFFFF0, 0x40000000, 0x40000001, 0x20000001, 0, 1, 0xFFFF]
SPECIAL_U64 = [2**64 - 1, 2**63 - 1, 2**63, 2**32, 2**32 - 1, 0, 1, 2**64 - 128]
# 250 x 12 base files = 3000; raise with EXIRC_HOSTILE_MUTATIONS for a long hunt.
MUTATIONS_PER_BASE = int(os.environ.get("EXIRC_HOSTILE_MUTATIONS", "250"))
CLI_EVERY = 10            # every 10th mutation also goes through `exirc inspect`


_MARKS: dict[str, dict[str, int]] = {}


def _marks(key: str) -> dict[str, int]:
    """Positions of every table and vector of a base file written by the test's
    own writer (`name/raw`); empty for exirc's files."""
    name, writer = key.split("/")
    if writer != "raw":
        return {}
    if key not in _MARKS:
        _MARKS[key] = H.encode(H.BASE_PROGRAMS[name]()).marks
    return _MARKS[key]


def _pos(rng: random.Random, data: bytes, width: int = 1, aligned: bool = False) -> int:
    """A position, mostly inside the FlatBuffer (where the structure is)."""
    program_size = min(len(data), H.parse_header(data)["program_size"]) \
        if len(data) >= 40 else len(data)
    limit = program_size if rng.random() < 0.85 else len(data)
    pos = rng.randrange(0, max(1, limit - width + 1))
    return pos & ~3 if aligned else pos


def _mutate(key: str, index: int, base: bytes | None = None) -> tuple[bytes, str]:
    """The `index`-th mutation of base file `key`, and what it did."""
    rng = random.Random(f"{key}#{index}")
    data = bytearray(_base_file(key) if base is None else base)
    kinds = ["bitflip", "bitflip", "overwrite", "truncate", "append", "special32", "special32",
             "special32", "nudge", "swap", "header", "zero_run", "multi"]
    marks = _marks(key)
    if marks:
        kinds += ["structural"] * 3
    kind = rng.choice(kinds)
    steps = [kind] if kind != "multi" else [
        rng.choice(["bitflip", "special32", "nudge", "overwrite"]) for _ in range(3)]
    done = []
    for step in steps:
        if step == "bitflip":
            for _ in range(rng.randint(1, 4)):
                p = _pos(rng, data)
                bit = rng.randrange(8)
                data[p] ^= 1 << bit
                done.append(f"flip byte {p} bit {bit}")
        elif step == "overwrite":
            p = _pos(rng, data)
            n = rng.randint(1, 16)
            chunk = rng.randbytes(n)
            data[p:p + n] = chunk[:len(data) - p]
            done.append(f"overwrite {p}..{p + n} with {chunk.hex()}")
        elif step == "truncate":
            n = rng.randrange(0, len(data))
            del data[n:]
            done.append(f"truncate to {n} bytes")
        elif step == "append":
            extra = rng.randbytes(rng.randint(1, 300))
            data += extra
            done.append(f"append {len(extra)} random bytes")
        elif step == "special32":
            p = _pos(rng, data, 4, aligned=True)
            v = rng.choice(SPECIAL_U32 + [len(data), len(data) - 4, len(data) + 4])
            v &= 0xFFFFFFFF
            data[p:p + 4] = v.to_bytes(4, "little")
            done.append(f"u32 at {p} = {v:#x}")
        elif step == "nudge":
            p = _pos(rng, data, 4, aligned=True)
            old = int.from_bytes(data[p:p + 4], "little")
            delta = rng.choice([-16, -8, -4, -2, -1, 1, 2, 4, 8, 16, 64])
            v = (old + delta) & 0xFFFFFFFF
            data[p:p + 4] = v.to_bytes(4, "little")
            done.append(f"u32 at {p}: {old:#x} -> {v:#x}")
        elif step == "swap":
            n = rng.randint(4, 32)
            a = _pos(rng, data, n)
            b = _pos(rng, data, n)
            a, b = min(a, b), max(a, b)
            if a + n <= b and b + n <= len(data):
                ra, rb = bytes(data[a:a + n]), bytes(data[b:b + n])
                data[a:a + n], data[b:b + n] = rb, ra
                done.append(f"swap {n} bytes at {a} and {b}")
            else:
                data[a:a + 4], data[b:b + 4] = bytes(data[b:b + 4]), bytes(data[a:a + 4])
                done.append(f"swap 4 bytes at {a} and {b}")
        elif step == "header":
            field_offset = rng.choice([16, 24, 32])  # program_size, base, data size
            v = rng.choice(SPECIAL_U64 + [len(data) + 1, len(data) - 1, 0x80])
            data[field_offset:field_offset + 8] = v.to_bytes(8, "little")
            done.append(f"header u64 at {field_offset} = {v:#x}")
        elif step == "structural":
            # Hit a known table or vector: its soffset / length word, or the
            # first word after it (a vector's first element).
            name = rng.choice(sorted(marks))
            p = marks[name] + rng.choice([0, 0, 4])
            v = rng.choice(SPECIAL_U32 + [(-rng.randint(1, 64)) & 0xFFFFFFFF,
                                          rng.randint(2, 4096), len(data), len(data) + 4])
            if p + 4 <= len(data):
                data[p:p + 4] = v.to_bytes(4, "little")
            done.append(f"u32 at {p} ({name}{'' if p == marks[name] else '+4'}) = {v:#x}")
        elif step == "zero_run":
            p = _pos(rng, data)
            n = rng.randint(1, 24)
            data[p:p + n] = bytes(min(n, len(data) - p))
            done.append(f"zero {p}..{p + n}")
    return bytes(data), "; ".join(done)


def _check_cli(path: Path, capsys, label: str, problems: list[str]) -> None:
    for extra in ([], ["--json"], ["--show", "instructions"]):
        argv = ["inspect", str(path), *extra]
        start = time.process_time()
        try:
            with _watchdog(10 * CPU_LIMIT):
                code = main(argv)
        except _Deadline:
            problems.append(f"{label}: `exirc {' '.join(argv[:1] + extra)}` hung")
            continue
        except BaseException as exc:  # noqa: BLE001
            capsys.readouterr()
            problems.append(f"{label}: main({extra}) raised {type(exc).__name__}: {exc}"[:400])
            continue
        seconds = time.process_time() - start
        captured = capsys.readouterr()
        if code not in (0, 3):
            problems.append(f"{label}: inspect {extra} exit code {code!r}; "
                            f"stderr: {captured.err.strip()[:300]!r}")
        elif code == 3:
            err = captured.err.strip()
            if not err or "Traceback" in err or len(err.splitlines()) > 3:
                problems.append(f"{label}: inspect {extra} exit 3 with stderr {err[:500]!r}")
        if seconds > CPU_LIMIT:
            problems.append(f"{label}: inspect {extra} took {seconds:.2f} s of CPU time")


@pytest.mark.parametrize("key", BASE_KEYS)
def test_mutated_files_are_read_or_rejected(key: str, tmp_path: Path, capsys) -> None:
    base = _base_file(key)
    problems: list[str] = []
    slow: list[str] = []
    outcomes = {"ok": 0, "format": 0}
    path = tmp_path / "warm-up.pte"
    path.write_bytes(base)
    main(["inspect", str(path)])  # warm up imports before timing anything
    capsys.readouterr()
    for index in range(MUTATIONS_PER_BASE):
        data, what = _mutate(key, index, base)
        label = f"{key} mutation #{index} ({what})"
        outcome, value, seconds = _read(data)
        if outcome in outcomes:
            outcomes[outcome] += 1
        if outcome == "other":
            tb = traceback.extract_tb(value.__traceback__)[-1]
            problems.append(f"{label}: {type(value).__name__}: {value} "
                            f"[at {Path(tb.filename).name}:{tb.lineno}]"[:600])
        elif outcome == "hang":
            problems.append(f"{label}: did not finish within {10 * CPU_LIMIT} s of CPU time")
        elif outcome == "ok":
            broken = _broken_invariant(value)
            if broken:
                problems.append(f"{label}: accepted, but {broken}")
        if seconds > CPU_LIMIT:
            slow.append(f"{label}: {seconds:.2f} s of CPU time")
        if index % CLI_EVERY == 0:
            # A new file each time: never rewrite a file a mapping may still use.
            path = tmp_path / f"mutated-{index}.pte"
            path.write_bytes(data)
            _check_cli(path, capsys, label, problems)
    assert not problems and not slow, (
        f"{len(problems)} misbehaving and {len(slow)} slow of {MUTATIONS_PER_BASE} mutations "
        f"of {key} (reproduce: tests.serialize.test_hostile_files._mutate({key!r}, index)):\n"
        + "\n".join(problems[:25] + slow[:10]))
    # The mutations must reach the checks, not only be harmless.
    assert outcomes["format"] > MUTATIONS_PER_BASE // 4, outcomes


def test_mutations_are_reproducible() -> None:
    assert _mutate("minimal/raw", 7) == _mutate("minimal/raw", 7)
    assert _mutate("minimal/raw", 7)[0] != _base_file("minimal/raw")


# ==========================================================================
# (a) Huge vector lengths in small files: rejected without allocating
# ==========================================================================

HUGE_LENGTHS = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x40000001, 0x3FFFFFFF, 0x20000001]


def _assert_small_allocation(data: bytes, fields: tuple[str, ...]) -> None:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _expect_format_error(data, fields=fields)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"peak allocation {peak} bytes for a {len(data)}-byte file"


@pytest.mark.parametrize("length", HUGE_LENGTHS, ids=hex)
@pytest.mark.parametrize("slot", ["execution_plan", "constant_buffer", "segments",
                                  "backend_delegate_data"])
def test_huge_vector_length_in_tiny_file(slot: str, length: int) -> None:
    data = H.tiny_program_with_vector_length(length, slot)
    assert len(data) < 100
    _assert_small_allocation(data, (slot,))


@pytest.mark.parametrize("length", HUGE_LENGTHS, ids=hex)
@pytest.mark.parametrize("base, mark, field", [
    ("minimal", "execution_plan[0].values", "values"),
    ("minimal", "execution_plan[0].outputs", "outputs"),
    ("minimal", "execution_plan[0].non_const_buffer_sizes", "non_const_buffer_sizes"),
    ("minimal", "execution_plan[0].name", "name"),
    ("two_plans", "constant_buffer[1].storage", "storage"),
    ("every_value", "execution_plan[0].values[7].val.items", "items"),
    ("every_value", "execution_plan[0].values[9].val.items", "items"),
    ("every_value", "execution_plan[0].values[4].val.dim_order", "dim_order"),
    ("every_value", "execution_plan[0].chains[0].stacktrace[0].items[0].context", "context"),
    ("constants_in_segment", "constant_segment.offsets", "offsets"),
    ("delegates", "execution_plan[0].delegates[0].compile_specs[0].value", "value"),
])
def test_huge_length_of_inner_vector(base: str, mark: str, field: str, length: int) -> None:
    enc = H.encode(H.BASE_PROGRAMS[base]())
    data = H.put_u32(enc.data, enc.at(mark), length)
    _assert_small_allocation(data, (field,))


# ==========================================================================
# (b) Tensor byte sizes that overflow fixed-width integers
# ==========================================================================

OVERFLOWING_SIZES = [
    [2**31 - 1] * 3,             # 2**93: overflows int64
    [2**31 - 1] * 8,
    [1 << 30, 1 << 30, 16],      # x4 bytes = 2**66: wraps to exactly 0 in 64 bits
    [65536, 65536],              # numel 2**32: wraps to 0 in 32 bits
    [1 << 16, 1 << 16, 1 << 16, 1 << 16],  # 2**64: wraps to 0 in 64 bits
    [-2, -2],                    # negative dims whose product looks small
    [-1, 1],                     # negative numel
    [0, -5],                     # zero numel hiding a negative dim
]


def _tensor_with_sizes(sizes: list[int], **kw) -> P.Tensor:
    return P.Tensor(ST.FLOAT, sizes, list(range(len(sizes))), **kw)


@pytest.mark.parametrize("sizes", OVERFLOWING_SIZES, ids=str)
def test_planned_tensor_byte_size_overflow(sizes: list[int]) -> None:
    program = H.constants_in_segment()
    values = list(program.execution_plan[0].values)
    values[4] = _tensor_with_sizes(sizes, allocation_info=P.AllocationDetails.at(1, 32))
    data = _encode(H.with_plan(program, values=values))
    _expect_format_error(data, fields=("sizes", "nbytes", "allocation", "memory",
                                       "non_const_buffer_sizes", "byte", "size"))


@pytest.mark.parametrize("sizes", OVERFLOWING_SIZES, ids=str)
def test_constant_tensor_byte_size_overflow(sizes: list[int]) -> None:
    program = H.constants_in_segment()
    values = list(program.execution_plan[0].values)
    values[1] = _tensor_with_sizes(sizes, data_buffer_idx=1)
    _expect_format_error(_encode(H.with_plan(program, values=values)),
                         fields=("sizes", "nbytes", "data_buffer_idx", "constant", "size"))


@pytest.mark.parametrize("sizes", OVERFLOWING_SIZES[:5], ids=str)
def test_inline_constant_tensor_byte_size_overflow(sizes: list[int]) -> None:
    program = H.two_plans()
    values = list(program.execution_plan[0].values)
    values[0] = P.Tensor(ST.INT, sizes, list(range(len(sizes))), data_buffer_idx=1)
    _expect_format_error(_encode(H.with_plan(program, values=values)),
                         fields=("sizes", "nbytes", "data_buffer_idx", "constant", "size"))


@pytest.mark.parametrize("offset", [2**64 - 16, 2**63, 2**32, 96 - 8])
def test_planned_tensor_offset_beyond_its_buffer(offset: int) -> None:
    program = H.constants_in_segment()
    values = list(program.execution_plan[0].values)
    values[5] = _tensor_with_sizes([2, 3], allocation_info=P.AllocationDetails.at(1, offset))
    _expect_format_error(_encode(H.with_plan(program, values=values)),
                         fields=("allocation", "memory_offset", "offset", "non_const_buffer"))


def test_planned_tensor_byte_size_overflow_dynamic_bound() -> None:
    program = H.constants_in_segment()
    values = list(program.execution_plan[0].values)
    values[4] = _tensor_with_sizes(
        [1 << 30, 1 << 30, 16], allocation_info=P.AllocationDetails.at(1, 32),
        shape_dynamism=P.TensorShapeDynamism.DYNAMIC_BOUND)
    _expect_format_error(_encode(H.with_plan(program, values=values)))


# ==========================================================================
# (c) Offsets that would be negative or point outside the buffer
# ==========================================================================


@pytest.mark.parametrize("root", [0xFFFFFFFF, 0x80000000, 0xFFFFFFF8, 0xFFFFFFFC, 0x7FFFFFFF])
def test_root_offset_out_of_buffer(root: int) -> None:
    data = _encode(H.minimal())
    _expect_format_error(H.put_u32(data, 0, root))


@pytest.mark.parametrize("root", [0, 1, 2, 3, 4, 8])
def test_root_offset_into_the_header(root: int) -> None:
    # A table "inside" the file identifier / header: garbage, not a crash.
    data = _encode(H.minimal())
    outcome, value, seconds = _read(H.put_u32(data, 0, root))
    assert outcome in ("ok", "format"), repr(value)
    assert seconds < CPU_LIMIT


@pytest.mark.parametrize("table", ["root", "execution_plan[0]", "execution_plan[0].values[0]",
                                   "execution_plan[0].values[0].val"])
@pytest.mark.parametrize("delta", [8, 4096, 2**31 - 1])
def test_vtable_before_start_of_buffer(table: str, delta: int) -> None:
    """soffset such that table_pos - soffset < 0 (Python would index from the end)."""
    enc = H.encode(H.minimal())
    pos = enc.at(table)
    soffset = min(pos + delta, 2**31 - 1)
    _expect_format_error(H.put_i32(enc.data, pos, soffset))


@pytest.mark.parametrize("table", ["root", "execution_plan[0]", "execution_plan[0].values[0]"])
@pytest.mark.parametrize("soffset", [-(2**31), -4096, -1, 1, 2, 0])
def test_vtable_after_end_or_misplaced(table: str, soffset: int) -> None:
    enc = H.encode(H.minimal())
    pos = enc.at(table)
    if soffset in (-4096, -(2**31)):
        _expect_format_error(H.put_i32(enc.data, pos, soffset))
    else:
        # The vtable lands inside the file, on garbage: read or rejected.
        outcome, value, seconds = _read(H.put_i32(enc.data, pos, soffset))
        assert outcome in ("ok", "format"), repr(value)
        assert seconds < CPU_LIMIT


@pytest.mark.parametrize("value", [0xFFFF, 0xFFFC, 0x8000, 0, 1, 2, 3, 5])
@pytest.mark.parametrize("which", ["vtable_size", "table_size", "field"])
def test_vtable_fields_out_of_range(which: str, value: int) -> None:
    enc = H.encode(H.minimal())
    root = enc.at("root")
    vtable = root - H.i32(enc.data, root)
    pos = {"vtable_size": vtable, "table_size": vtable + 2, "field": vtable + 4 + 2 * 1}[which]
    data = H.put(enc.data, pos, "H", value)
    outcome, err, seconds = _read(data)
    assert outcome in ("ok", "format"), repr(err)
    assert seconds < CPU_LIMIT
    if which == "field" and value >= 0x8000:
        assert outcome == "format"  # execution_plan's uoffset would be outside the file


@pytest.mark.parametrize("value", [0xFFFFFFFC, 0xFFFFFFF8, 0x80000000, 0xFFFFFFFF])
def test_vector_element_offset_wraps_backwards(value: int) -> None:
    enc = H.encode(H.minimal())
    vec = enc.at("execution_plan")
    _expect_format_error(H.put_u32(enc.data, vec + 4, value))


def test_self_referencing_vector_entry() -> None:
    _expect_format_error(H.self_referencing_vector_entry())


@pytest.mark.parametrize("value", [0xFFFFFFF0, 0x80000000, 0xFFFFFFFF])
def test_table_field_offset_wraps_backwards(value: int) -> None:
    enc = H.encode(H.minimal())
    field = H.field_pos(enc.data, enc.at("root"), 1)  # Program.execution_plan
    assert field is not None
    _expect_format_error(H.put_u32(enc.data, field, value), fields=("execution_plan",))


def test_union_offset_wraps_backwards() -> None:
    enc = H.encode(H.minimal())
    ev = enc.at("execution_plan[0].values[0]")
    field = H.field_pos(enc.data, ev, 1)  # EValue.val
    assert field is not None
    _expect_format_error(H.put_u32(enc.data, field, 0xFFFFFFFC))


def test_string_without_terminator_at_end_of_buffer() -> None:
    # Move a string so its bytes run to the very end of the file.
    enc = H.encode(H.minimal())
    name = enc.at("execution_plan[0].name")
    length = H.u32(enc.data, name)
    data = H.put_u32(enc.data, name, len(enc.data) - name - 4 + 1)
    _expect_format_error(data)
    assert length == len("forward")


def test_string_with_invalid_utf8() -> None:
    enc = H.encode(H.minimal())
    name = enc.at("execution_plan[0].name")
    data = bytearray(enc.data)
    data[name + 4:name + 6] = b"\xff\xfe"
    _expect_format_error(bytes(data), fields=("name",))


# ==========================================================================
# (d) DAG bombs: shared sub-tables at every level
# ==========================================================================

_ISOLATED = r"""
import json, sys, time
from exirc.errors import FormatError
from exirc.serialize import deserialize
data = open(sys.argv[1], "rb").read()
start = time.process_time()
try:
    deserialize(data)
    outcome = "ok"
    message = ""
except FormatError as exc:
    outcome = "format"
    message = str(exc)
except BaseException as exc:
    outcome = "other"
    message = f"{type(exc).__name__}: {exc}"
print(json.dumps({"outcome": outcome, "message": message[:500],
                  "seconds": time.process_time() - start}))
"""


def _read_isolated(data: bytes, tmp_path: Path, cpu_limit: int = 10) -> dict:
    """deserialize in a child process, so a reader that would run for hours
    fails the test instead of hanging the suite (C loops ignore signals sent
    to Python): the kernel stops the child at `cpu_limit` seconds of CPU time
    (SIGXCPU). The timeout is a cap for a child making no progress at all."""
    path = tmp_path / "isolated.pte"
    path.write_bytes(data)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 1))

    try:
        done = subprocess.run([sys.executable, "-c", _ISOLATED, str(path)],
                              capture_output=True, text=True, timeout=60 * cpu_limit,
                              cwd=Path(__file__).resolve().parents[2], preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"deserialize of a {len(data)}-byte file made no progress for "
                    f"{60 * cpu_limit} s")
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        pytest.fail(f"deserialize of a {len(data)}-byte file ran over {cpu_limit} s of CPU time")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("builder", [H.dag_bomb_plan, H.dag_bomb_program],
                         ids=["shared-chains-instructions-frames", "shared-plans"])
def test_dag_bomb_is_cheap(builder, tmp_path: Path) -> None:
    data = builder()
    assert len(data) < 12 * 1024
    result = _read_isolated(data, tmp_path)
    assert result["outcome"] in ("ok", "format"), result
    assert result["seconds"] < CPU_LIMIT, result


@pytest.mark.parametrize("builder", [H.dag_bomb_plan, H.dag_bomb_program],
                         ids=["shared-chains-instructions-frames", "shared-plans"])
def test_dag_bomb_memory(builder, tmp_path: Path) -> None:
    # Only run in-process once the bomb is known not to hang.
    result = _read_isolated(builder(), tmp_path)
    if result["seconds"] > 5:
        pytest.fail(f"too slow to measure memory ({result['seconds']:.1f} s of CPU time): "
                    f"{result}")
    tracemalloc.start()
    try:
        _read(builder())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64_000_000, f"peak {peak} bytes for a ~8 KiB file"


def test_dag_bomb_inspect(tmp_path: Path, capsys) -> None:
    data = H.dag_bomb_plan()
    result = _read_isolated(data, tmp_path)
    if result["outcome"] != "format":
        pytest.skip("the reader accepts shared tables; inspect of it prints n**3 lines")
    path = tmp_path / "bomb.pte"
    path.write_bytes(data)
    assert main(["inspect", str(path)]) == 3
    assert "Traceback" not in capsys.readouterr().err


# ==========================================================================
# (e) Header and file-level traps
# ==========================================================================


@pytest.mark.parametrize("length", [0, 1, 3, 4, 7, 8, 11, 12, 16, 24, 39])
def test_truncated_header(length: int) -> None:
    data = serialize(H.minimal())
    _expect_format_error(data[:length])


@pytest.mark.parametrize("identifier", [b"ET13", b"XXXX", b"\0\0\0\0", b"et12"])
def test_wrong_file_identifier(identifier: bytes) -> None:
    data = serialize(H.minimal())
    _expect_format_error(data[:4] + identifier + data[8:], fields=("identifier", "ET12"))


@pytest.mark.parametrize("magic", [b"eh01", b"EH00", b"\0\0\0\0", b"xxxx"])
def test_wrong_header_magic_with_segments(magic: bytes) -> None:
    data = serialize(H.constants_in_segment())
    _expect_format_error(data[:8] + magic + data[12:],
                         fields=("eh00", "header", "magic", "segment"))


@pytest.mark.parametrize("length", [0, 8, 23, 33, 0xFFFFFFFF, 0x80000000])
def test_wrong_header_length(length: int) -> None:
    data = serialize(H.constants_in_segment())
    outcome, value, seconds = _read(H.put_u32(data, 12, length))
    assert seconds < CPU_LIMIT
    if length < 24 or length > len(data):
        assert outcome == "format", repr(value)
    else:
        assert outcome in ("ok", "format"), repr(value)


@pytest.mark.parametrize("delta", [1, 4096, "2**63", "2**64-1"])
def test_header_program_size_beyond_file(delta) -> None:
    data = serialize(H.minimal())
    size = {"2**63": 2**63, "2**64-1": 2**64 - 1}.get(delta) if isinstance(delta, str) \
        else len(data) + delta
    _expect_format_error(H.put_u64(data, 16, size), fields=("program_size",))


@pytest.mark.parametrize("size", [0, 8, 39])
def test_header_program_size_too_small(size: int) -> None:
    data = serialize(H.minimal())
    _expect_format_error(H.put_u64(data, 16, size), fields=("program_size",))


def test_header_program_size_cuts_the_flatbuffer() -> None:
    # The root table lies beyond program_size: the FlatBuffer must be read
    # within program_size only.
    enc = H.encode(H.minimal())
    data = H.put_u64(enc.data, 16, enc.at("root") - 8)
    _expect_format_error(data)


@pytest.mark.parametrize("field_offset, value", [
    (24, 2**64 - 1), (24, 2**63), (24, 10**6),   # segment_base_offset
    (32, 2**64 - 1), (32, 2**63), (32, 10**6),   # segment_data_size
])
def test_header_segment_fields_beyond_file(field_offset: int, value: int) -> None:
    data = serialize(H.constants_in_segment())
    _expect_format_error(H.put_u64(data, field_offset, value),
                         fields=("segment_base_offset", "segment_data_size", "segment"))


@pytest.mark.parametrize("slot, value", [
    (0, 2**64 - 1), (0, 2**63), (0, 10**6),          # DataSegment.offset
    (1, 2**64 - 1), (1, 2**63), (1, 10**6),          # DataSegment.size
    (1, 2**64 - 128),                                # offset + size wraps in 64 bits
])
def test_data_segment_beyond_end_of_file(slot: int, value: int) -> None:
    enc = H.encode(H.delegates())
    # segments[1]: its offset is not 0, so the field is stored (0 is the default).
    pos = H.field_pos(enc.data, enc.at("segments[1]"), slot)
    assert pos is not None
    _expect_format_error(H.put_u64(enc.data, pos, value),
                         fields=("segments", "segment", "offset", "size"))


def test_data_segment_cut_by_truncation() -> None:
    data = serialize(H.delegates())
    _expect_format_error(data[:-1], fields=("segment",))


@pytest.mark.parametrize("base", [8, 64])
def test_data_segment_overlapping_the_flatbuffer(base: int) -> None:
    # segment_base_offset inside the header / FlatBuffer: the "constants"
    # would be the program's own bytes.
    data = serialize(H.constants_in_segment())
    _expect_format_error(H.put_u64(data, 24, base), fields=("segment",))


@pytest.mark.parametrize("index", [1, 7, 2**32 - 1])
def test_constant_segment_index_out_of_range(index: int) -> None:
    program = H.constants_in_segment()
    program.constant_segment = P.SubsegmentOffsets(index, program.constant_segment.offsets)
    _expect_format_error(_encode(program), fields=("segment_index",))


@pytest.mark.parametrize("offsets", [[0, 0, 2**64 - 1], [0, 10**6, 32], [0, 32, 0],
                                     [0, 0, 2**63]])
def test_constant_segment_offsets_out_of_range(offsets: list[int]) -> None:
    program = H.constants_in_segment()
    program.constant_segment = P.SubsegmentOffsets(0, offsets)
    _expect_format_error(_encode(program), fields=("offsets", "constant", "data_buffer_idx"))


@pytest.mark.parametrize("offsets", [[0, 0, 0], [0, 32, 16], [0, 16, 0]])
def test_constant_segment_offsets_not_increasing(offsets: list[int]) -> None:
    """Each constant must get the bytes the reader promised it: either the
    file is rejected or `Program.constant_data` covers every tensor."""
    program = H.constants_in_segment()
    program.constant_segment = P.SubsegmentOffsets(0, offsets)
    outcome, value, seconds = _read(_encode(program))
    assert outcome in ("ok", "format"), repr(value)
    if outcome == "ok":
        assert _broken_invariant(value) is None, _broken_invariant(value)


# ==========================================================================
# (e) Cross-reference and enum traps, each naming its field
# ==========================================================================


def _replace_instruction(program: P.Program, index: int, instr) -> P.Program:
    plan = program.execution_plan[0]
    chain = plan.chains[0]
    instrs = list(chain.instructions)
    instrs[index] = instr
    chains = [dataclasses.replace(chain, instructions=instrs), *plan.chains[1:]]
    return H.with_plan(program, chains=chains)


def _replace_value(program: P.Program, index: int, value) -> P.Program:
    values = list(program.execution_plan[0].values)
    values[index] = value
    return H.with_plan(program, values=values)


@pytest.mark.parametrize("op_index", [2, 1000, -1, -(2**31)])
def test_kernel_call_op_index_out_of_range(op_index: int) -> None:
    program = _replace_instruction(H.constants_in_segment(), 1, P.KernelCall(op_index, [4, 2, 5]))
    _expect_format_error(_encode(program), fields=("op_index",))


@pytest.mark.parametrize("arg", [6, 99, -1, 2**31 - 1])
def test_kernel_call_arg_out_of_range(arg: int) -> None:
    program = _replace_instruction(H.constants_in_segment(), 0, P.KernelCall(0, [0, 1, arg, 4]))
    _expect_format_error(_encode(program), fields=("args",))


@pytest.mark.parametrize("destination", [5, 99, -1, 2**31 - 1])
def test_jump_destination_out_of_range(destination: int) -> None:
    program = _replace_instruction(H.two_plans(), 0, P.JumpFalseCall(3, destination))
    _expect_format_error(_encode(program), fields=("destination_instruction",))


@pytest.mark.parametrize("cond", [6, -1])
def test_jump_condition_out_of_range(cond: int) -> None:
    program = _replace_instruction(H.two_plans(), 0, P.JumpFalseCall(cond, 2))
    _expect_format_error(_encode(program), fields=("cond_value_index",))


@pytest.mark.parametrize("instr, field", [
    (P.MoveCall(6, 2), "move_from"),
    (P.MoveCall(5, -1), "move_to"),
    (P.FreeCall(6), "value_index"),
    (P.FreeCall(-3), "value_index"),
])
def test_move_and_free_indices_out_of_range(instr, field: str) -> None:
    _expect_format_error(_encode(_replace_instruction(H.two_plans(), 2, instr)), fields=(field,))


@pytest.mark.parametrize("instr, field", [
    (P.DelegateCall(2, [0, 1]), "delegate_index"),
    (P.DelegateCall(-1, [0, 1]), "delegate_index"),
    (P.DelegateCall(0, [0, 3]), "args"),
])
def test_delegate_call_out_of_range(instr, field: str) -> None:
    _expect_format_error(_encode(_replace_instruction(H.delegates(), 0, instr)), fields=(field,))


@pytest.mark.parametrize("location, index", [
    (P.DataLocation.SEGMENT, 3), (P.DataLocation.INLINE, 1), (P.DataLocation.SEGMENT, 2**32 - 1),
])
def test_delegate_payload_reference_out_of_range(location, index: int) -> None:
    program = H.delegates()
    plan = program.execution_plan[0]
    dels = list(plan.delegates)
    dels[0] = dataclasses.replace(dels[0],
                                  processed=P.BackendDelegateDataReference(location, index))
    _expect_format_error(_encode(H.with_plan(program, delegates=dels)),
                         fields=("processed", "index"))


def test_delegate_location_unknown() -> None:
    program = H.delegates()
    plan = program.execution_plan[0]
    dels = list(plan.delegates)
    dels[0] = dataclasses.replace(dels[0], processed=P.BackendDelegateDataReference(7, 0))
    _expect_format_error(_encode(H.with_plan(program, delegates=dels)),
                         fields=("location",))


@pytest.mark.parametrize("field, change", [
    ("inputs", {"inputs": [6]}),
    ("inputs", {"inputs": [-1]}),
    ("outputs", {"outputs": [100]}),
])
def test_plan_inputs_outputs_out_of_range(field: str, change: dict) -> None:
    _expect_format_error(_encode(H.with_plan(H.constants_in_segment(), **change)),
                         fields=(field,))


@pytest.mark.parametrize("value", [P.TensorList([4, 99]), P.TensorList([4, 1]),
                                   P.OptionalTensorList([4, -2]),
                                   P.OptionalTensorList([4, 6])])
def test_tensor_list_items_invalid(value) -> None:
    # 99 / -2: out of range (-1 means None in an OptionalTensorList);
    # 1 (an Int) / 6 (a String): not a tensor.
    _expect_format_error(_encode(_replace_value(H.every_value(), 10, value)),
                         fields=("items",))


@pytest.mark.parametrize("tag", [12, 13, 100, 255])
def test_evalue_union_tag_out_of_range(tag: int) -> None:
    program = _replace_value(H.constants_in_segment(), 3, H.RawUnion(tag, P.Int(1)))
    _expect_format_error(_encode(program),
                         pattern=r"\bval(_type)?\b|union|tag|KernelTypes|type")


def test_evalue_union_tag_none() -> None:
    program = _replace_value(H.constants_in_segment(), 3, H.RawUnion(0, None))
    outcome, value, seconds = _read(_encode(program))
    # NONE with no table is not a value the runtime can hold.
    assert outcome == "format", repr(value)


@pytest.mark.parametrize("tag", [P.KERNEL_TYPES.index(P.Tensor) + 1,
                                 P.KERNEL_TYPES.index(P.IntList) + 1])
def test_evalue_union_tag_without_table(tag: int) -> None:
    program = _replace_value(H.constants_in_segment(), 3, H.RawUnion(tag, None))
    _expect_format_error(_encode(program))


@pytest.mark.parametrize("tag, body", [
    (P.KERNEL_TYPES.index(P.Tensor) + 1, P.IntList([5] * 40)),
    (P.KERNEL_TYPES.index(P.String) + 1, P.Int(2**62)),
    (P.KERNEL_TYPES.index(P.IntList) + 1, P.Double(1.0)),
])
def test_evalue_union_tag_confusion(tag: int, body) -> None:
    # The table's own fields are read as another table's: read or rejected.
    program = _replace_value(H.every_value(), 1, H.RawUnion(tag, body))
    outcome, value, seconds = _read(_encode(program))
    assert outcome in ("ok", "format"), repr(value)
    assert seconds < CPU_LIMIT


@pytest.mark.parametrize("tag", [6, 7, 200, 0])
def test_instruction_union_tag_out_of_range(tag: int) -> None:
    body = P.FreeCall(0) if tag else None
    program = _replace_instruction(H.constants_in_segment(), 0, H.RawUnion(tag, body))
    _expect_format_error(_encode(program),
                         pattern=r"instr_args|union|tag|InstructionArguments|type")


@pytest.mark.parametrize("scalar_type", [8, 9, 10, 18, 21, 30, 127, -1, -128])
def test_unknown_scalar_type(scalar_type: int) -> None:
    tensor = P.Tensor(scalar_type, [2, 3], [0, 1], allocation_info=P.AllocationDetails.at(1, 0))
    program = _replace_value(H.constants_in_segment(), 0, tensor)
    _expect_format_error(_encode(program), fields=("scalar_type",))


@pytest.mark.parametrize("dim_order", [[0, 0], [1, 1], [1, 2], [0], [0, 1, 2], [255, 0]])
def test_dim_order_not_a_permutation(dim_order: list[int]) -> None:
    tensor = P.Tensor(ST.FLOAT, [2, 3], dim_order, allocation_info=P.AllocationDetails.at(1, 0))
    program = _replace_value(H.constants_in_segment(), 0, tensor)
    _expect_format_error(_encode(program), fields=("dim_order",))


@pytest.mark.parametrize("dynamism", [3, 100, -1])
def test_unknown_shape_dynamism(dynamism: int) -> None:
    tensor = P.Tensor(ST.FLOAT, [2, 3], [0, 1], allocation_info=P.AllocationDetails.at(1, 0),
                      shape_dynamism=dynamism)
    program = _replace_value(H.constants_in_segment(), 0, tensor)
    _expect_format_error(_encode(program), fields=("shape_dynamism",))


@pytest.mark.parametrize("idx", [3, 100, 2**32 - 1])
def test_constant_data_buffer_idx_out_of_range(idx: int) -> None:
    program = _replace_value(H.constants_in_segment(), 2, P.Tensor(ST.FLOAT, [3], [0],
                                                                   data_buffer_idx=idx))
    _expect_format_error(_encode(program), fields=("data_buffer_idx",))


def test_inline_constant_data_buffer_idx_out_of_range() -> None:
    program = _replace_value(H.two_plans(), 0, P.Tensor(ST.INT, [4], [0], data_buffer_idx=2))
    _expect_format_error(_encode(program), fields=("data_buffer_idx",))


@pytest.mark.parametrize("memory_id", [2, 100, 2**32 - 1])
def test_planned_memory_id_out_of_range(memory_id: int) -> None:
    tensor = P.Tensor(ST.FLOAT, [2, 3], [0, 1],
                      allocation_info=P.AllocationDetails.at(memory_id, 0))
    program = _replace_value(H.constants_in_segment(), 0, tensor)
    _expect_format_error(_encode(program), fields=("memory_id",))


def test_stacktrace_not_parallel_to_instructions() -> None:
    program = H.every_value()
    plan = program.execution_plan[0]
    chain = dataclasses.replace(plan.chains[0], stacktrace=plan.chains[0].stacktrace[:1])
    _expect_format_error(_encode(H.with_plan(program, chains=[chain, *plan.chains[1:]])),
                         fields=("stacktrace",))


@pytest.mark.parametrize("segment_index", [3, 2**32 - 1])
def test_named_data_segment_index_out_of_range(segment_index: int) -> None:
    program = H.delegates()
    program.named_data = [P.NamedData("weights.blob", segment_index)]
    _expect_format_error(_encode(program), fields=("segment_index",))


# ==========================================================================
# The CLI on the traps
# ==========================================================================


@pytest.mark.parametrize("make", [
    lambda: H.tiny_program_with_vector_length(0xFFFFFFFF),
    lambda: H.self_referencing_vector_entry(),
    lambda: serialize(H.minimal())[:20],
    lambda: _encode(_replace_instruction(H.constants_in_segment(), 1,
                                         P.KernelCall(9, [4, 2, 5]))),
], ids=["huge-vector", "backwards-offset", "truncated", "op-index"])
def test_inspect_reports_invalid_file(make, tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.pte"
    path.write_bytes(make())
    for extra in ([], ["--json"], ["--show", "instructions"]):
        assert main(["inspect", str(path), *extra]) == 3
        err = capsys.readouterr().err.strip()
        assert err and "Traceback" not in err
        assert len(err.splitlines()) <= 3, err
