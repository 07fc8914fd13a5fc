"""The external data file (`.ptd`): round trips, ExecuTorch's files both ways, hostile bytes.

`read_data_file` must, for any bytes, return a `DataFile` or raise `FormatError`
(never another exception); the seeded mutations below rebuild the same files
on every run.
"""

from __future__ import annotations

import random
import struct

import pytest

from exirc.errors import FormatError
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile, TensorLayout
from exirc.serialize.data_file.header import HEADER_AT, PADDED_LENGTH, SEGMENT_ALIGNMENT
from exirc.serialize.data_file.reader import read_data_file
from exirc.serialize.data_file.writer import write_data_file
from tests.oracle import requires_executorch

FLOAT = P.ScalarType.FLOAT


def _sample() -> DataFile:
    data = DataFile()
    data.add("fc.weight", struct.pack("<6f", *range(6)), TensorLayout(FLOAT, (2, 3), (0, 1)))
    data.add("fc.bias", struct.pack("<2f", 0.5, -0.5), TensorLayout(FLOAT, (2,), (0,)))
    data.add("tied", struct.pack("<6f", *range(6)), TensorLayout(FLOAT, (3, 2), (1, 0)))
    data.add("a" * 64, b"\x01\x02\x03", None)  # a delegate's weights: bytes, no layout
    return data


def _contents(data: DataFile) -> dict[str, tuple[bytes, TensorLayout | None]]:
    return {key: (bytes(s.data), s.layout) for key, s in data.entries.items()}


def test_round_trip_keeps_every_entry_and_is_deterministic() -> None:
    written = write_data_file(_sample())
    assert written == write_data_file(_sample())
    assert written[4:8] == b"FT01" and written[HEADER_AT:HEADER_AT + 4] == b"FH01"
    read = read_data_file(written)
    assert _contents(read) == _contents(_sample())
    # Equal bytes under two names are stored once: three distinct contents.
    base = int.from_bytes(written[HEADER_AT + 24:HEADER_AT + 32], "little")
    assert base % SEGMENT_ALIGNMENT == 0
    assert len(written) == base + 2 * SEGMENT_ALIGNMENT + 3


@requires_executorch
def test_executorch_reads_ours_and_we_read_executorchs() -> None:
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    theirs = FlatTensorSerializer().deserialize(Cord(write_data_file(_sample())))
    assert set(theirs.named_data) == set(_sample().entries)
    entry = theirs.named_data["tied"]
    assert bytes(theirs.buffers[entry.buffer_index]) == struct.pack("<6f", *range(6))
    assert list(entry.tensor_layout.sizes) == [3, 2]
    assert list(entry.tensor_layout.dim_order) == [1, 0]
    assert theirs.named_data["a" * 64].tensor_layout is None
    # ... and their writer's bytes, read by ours
    written = bytes(FlatTensorSerializer().serialize(theirs))
    assert _contents(read_data_file(written)) == _contents(_sample())


def _corrupt(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


@pytest.mark.parametrize(("name", "mutate", "message"), [
    ("not a data file", lambda d: b"\0" * 64, "file identifier is b'\\x00\\x00\\x00\\x00'"),
    ("a program", lambda d: _corrupt(d, 4, b"ET12"), "expected b'FT01': not a .ptd"),
    ("header magic", lambda d: _corrupt(d, HEADER_AT, b"XX01"), "header magic"),
    ("short header", lambda d: _corrupt(d, HEADER_AT + 4, struct.pack("<I", 8)),
     "header length 8"),
    ("flatbuffer past the end", lambda d: _corrupt(d, HEADER_AT + 16, struct.pack("<Q", 1 << 40)),
     "does not fit the"),
    ("segments past the end", lambda d: _corrupt(d, HEADER_AT + 32, struct.pack("<Q", 1 << 40)),
     "past the end of"),
    ("truncated", lambda d: d[:-1], "past the end of"),
    ("too short", lambda d: d[:20], "too short to be a data file"),
])
def test_malformed_files_are_format_errors(name: str, mutate: object, message: str) -> None:
    assert callable(mutate)
    with pytest.raises(FormatError, match=None) as raised:
        read_data_file(mutate(write_data_file(_sample())))
    assert message in raised.value.message, name
    assert raised.value.message.startswith("data file: ")
    assert ".ptd" in (raised.value.hint or "")


def _one_entry(layout: TensorLayout, data: bytes = b"\0" * 8, key: str = "w") -> bytes:
    file = DataFile()
    file.add(key, data, layout)
    return write_data_file(file)


@pytest.mark.parametrize(("layout", "message"), [
    (TensorLayout(FLOAT, (4, 4), (0, 1)), "'w' is float[4, 4] (64 bytes) but its segment has 8"),
    (TensorLayout(FLOAT, (2,), (1,)), "[1] is not a permutation of the 1 dimensions"),
    (TensorLayout(FLOAT, (-1,), (0,)), "size -1 is negative"),
    (TensorLayout(FLOAT, (1 << 30, 1 << 30), (0, 1)), "more than 2**48 bytes"),
])
def test_layouts_that_lie_are_refused(layout: TensorLayout, message: str) -> None:
    with pytest.raises(FormatError) as raised:
        read_data_file(_one_entry(layout))
    assert message in raised.value.message


def test_an_unknown_scalar_type_and_a_newer_version_are_refused() -> None:
    good = _one_entry(TensorLayout(FLOAT, (2,), (0,)))
    scalar = good.replace(bytes([FLOAT]), bytes([99]), 1)  # the layout's only byte of 6
    with pytest.raises(FormatError, match="99 is not a valid ScalarType"):
        read_data_file(scalar)
    newer = DataFile(version=7)
    with pytest.raises(FormatError, match="version 7 is newer than this reader"):
        read_data_file(write_data_file(newer))


def test_a_key_named_twice_is_refused() -> None:
    data = DataFile()
    data.add("key_a", b"\1" * 4)
    data.add("key_b", b"\2" * 4)
    written = write_data_file(data)
    renamed = written.replace(b"key_b", b"key_a")
    assert renamed.count(b"key_a") == 2
    with pytest.raises(FormatError, match="key 'key_a' is named twice"):
        read_data_file(renamed)


def test_seeded_mutations_end_in_a_data_file_or_a_format_error() -> None:
    base = write_data_file(_sample())
    rng = random.Random(0)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(600):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(PADDED_LENGTH + 256 if rng.random() < 0.8 else len(data))
            data[at] = rng.randrange(256)
        if rng.random() < 0.1:
            data = data[:rng.randrange(len(data))]
        try:
            read = read_data_file(bytes(data))
        except FormatError:
            outcomes["refused"] += 1
            continue
        outcomes["read"] += 1
        for stored in read.entries.values():  # whatever was read is within the file
            assert stored.layout is None or stored.layout.nbytes <= len(stored.data)
    assert outcomes["read"] > 50 and outcomes["refused"] > 50, outcomes
