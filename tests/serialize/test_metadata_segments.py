"""exirc's own metadata segments (constant names, input/output names, module
paths, symbolic shapes) cost as little as they can: zlib-compressed JSON,
stored packed after the aligned segments (no padding), still read from files
that hold plain JSON, and a stream that inflates past its bound or is broken
is a format error naming the segment, never a crash or a memory blow-up."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import FormatError
from exirc.runtime import load
from exirc.serialize import (
    constant_names,
    deserialize,
    io_names,
    json_segment,
    module_paths,
    read_program_file,
)
from exirc.serialize.header import SEGMENT_ALIGNMENT
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.oracle import requires_executorch, run_with_executorch
from tests.programs import add_constant_program

METADATA_KEYS = (constant_names.NAMED_DATA_KEY, io_names.NAMED_DATA_KEY,
                 module_paths.NAMED_DATA_KEY)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(12, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


def _file(target: str) -> tuple[bytes, torch.nn.Module, tuple[torch.Tensor]]:
    module = _Mlp().eval()
    inputs = (torch.randn(3, 12, generator=torch.Generator().manual_seed(1)),)
    result = compile_module(module, inputs, options=CompileOptions(target=target))
    return result.data, module, inputs


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_metadata_is_compressed_and_packed_after_the_aligned_segments(target: str) -> None:
    data, _, _ = _file(target)
    read = read_program_file(data)
    program = read.program
    keyed = {entry.key: entry.segment_index for entry in program.named_data}
    # Constant names only where the program has constants of its own (not
    # when every weight is the delegate's).
    assert {io_names.NAMED_DATA_KEY, module_paths.NAMED_DATA_KEY} <= set(keyed)
    base = read.header.segment_base_offset  # type: ignore[union-attr]
    metadata = sorted(keyed[key] for key in METADATA_KEYS if key in keyed)
    others = [i for i, (_, length) in enumerate(read.segment_spans)
              if length and i not in metadata]
    for index in metadata:
        segment = program.segments[index]
        assert segment.packed
        assert bytes(segment.data)[:1] != b"{"  # compressed, not the plain JSON
        assert zlib.decompress(bytes(segment.data)).startswith(b"{")
    starts = sorted(read.segment_spans[i][0] for i in metadata)
    assert (starts[0] - base) % SEGMENT_ALIGNMENT, "the first packed segment is unaligned"
    assert all(read.segment_spans[i][0] < starts[0] for i in others), \
        "aligned segments (constants, delegate data) come first"
    assert all((read.segment_spans[i][0] - base) % SEGMENT_ALIGNMENT == 0 for i in others)
    ends = {read.segment_spans[i][0] + read.segment_spans[i][1] for i in metadata}
    assert all(start in ends for start in starts[1:]), "back to back: no padding"
    assert serialize(deserialize(data)) == data  # read and written again: the same bytes
    if target == "portable":
        names = constant_names.decode(program.named_segment(constant_names.NAMED_DATA_KEY))
        assert "head.bias" in {name for listed in names.values() for name in listed}


def test_files_with_plain_json_metadata_still_read() -> None:
    program = add_constant_program()
    program.add_named_segment(constant_names.NAMED_DATA_KEY,
                              b'{"buffers":{"1":["w"]},"format_version":1}')
    read = deserialize(serialize(program)).named_segment(constant_names.NAMED_DATA_KEY)
    assert constant_names.decode(read) == {1: ["w"]}


@pytest.mark.parametrize("stream, message", [
    (zlib.compress(b'{"format_version":1,"buffers":{' + b" " * (1 << 25) + b"}}"),
     "once decompressed"),
    (zlib.compress(b'{"format_version":1,"buffers":{}}')[:-6], "truncated"),
    (b"\x78\x9c not a stream", "unreadable constant names"),
], ids=["inflates past the bound", "truncated", "not zlib"])
def test_a_bad_stream_is_a_format_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        stream: bytes, message: str) -> None:
    program = add_constant_program()
    program.add_named_segment(constant_names.NAMED_DATA_KEY, stream, packed=True)
    with pytest.raises(FormatError, match=message):
        constant_names.decode(
            deserialize(serialize(program)).named_segment(constant_names.NAMED_DATA_KEY))
    path = tmp_path / "bad.pte"
    path.write_bytes(serialize(program))
    code, _, err = run(capsys, "inspect", str(path), "--show", "size")
    assert code == 3 and constant_names.NAMED_DATA_KEY in err and "Traceback" not in err, err


def test_json_segment_round_trips() -> None:
    stored = json_segment.dump({"methods": {"forward": [1, 2]}}, 3)
    read = json_segment.parse(stored, key="k", what="things", version=3, max_bytes=1 << 10,
                              read=lambda document: document["methods"])
    assert read == {"forward": [1, 2]}


@requires_executorch
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_files_with_packed_metadata_run_on_executorch_and_exirc(target: str) -> None:
    data, module, inputs = _file(target)
    expected = module(*inputs)
    (theirs,) = run_with_executorch(data, inputs)
    (ours,) = load(data).run("forward", list(inputs))
    torch.testing.assert_close(theirs, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.as_tensor(ours), expected, rtol=1e-4, atol=1e-5)
