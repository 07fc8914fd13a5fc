"""exirc's own metadata (constant names, input/output names, module paths,
symbolic shapes, stack traces) costs as little as it can: one segment,
`exirc.metadata`, of deflate-compressed JSON (with a preset dictionary),
stored packed after the aligned segments (no padding), one row in the
FlatBuffer and no Frame tables. Files written before (a segment per kind,
plain or compressed JSON, stack traces in the chains) still read, and a
stream that inflates past its bound, is broken, or holds stack traces that
do not fit the chains is a format error naming the segment, never a crash
or a memory blow-up."""

from __future__ import annotations

import json
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
    metadata,
    module_paths,
    read_program_file,
)
from exirc.serialize import program as P
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
def test_metadata_is_one_compressed_segment_packed_after_the_aligned_ones(target: str) -> None:
    data, _, _ = _file(target)
    read = read_program_file(data)
    program = read.program
    keys = [entry.key for entry in program.named_data if entry.key.startswith("exirc.")]
    assert keys == [metadata.NAMED_DATA_KEY]
    (index,) = [e.segment_index for e in program.named_data if e.key == metadata.NAMED_DATA_KEY]
    segment = program.segments[index]
    assert segment.packed and index == len(program.segments) - 1
    document = json.loads(metadata.decompress(segment.data))
    assert document["format_version"] == metadata.FORMAT_VERSION
    # Constant names only where the program has constants of its own (not
    # when every weight is the delegate's).
    assert {"io_names", "module_paths", "stack_traces"} <= set(document)
    assert b"Frame" not in data and b"_Mlp" not in data.replace(bytes(segment.data), b"")
    base = read.header.segment_base_offset  # type: ignore[union-attr]
    start, length = read.segment_spans[index]
    assert (start - base) % SEGMENT_ALIGNMENT, "the packed segment is unaligned"
    assert start + length == len(data)
    others = [i for i, (_, size) in enumerate(read.segment_spans) if size and i != index]
    assert all((read.segment_spans[i][0] - base) % SEGMENT_ALIGNMENT == 0 for i in others)
    assert serialize(deserialize(data)) == data  # read and written again: the same bytes
    # What the rest of exirc reads is where it was: names, paths, stack traces.
    assert io_names.stored_io_names(program)["forward"].inputs == ["x"]
    assert any(path for chain in module_paths.stored_module_paths(program).methods["forward"]
               for path in chain)
    assert all(chain.stacktrace for chain in program.execution_plan[0].chains)
    if target == "portable":
        names = constant_names.decode(metadata.stored(program, constant_names.NAMED_DATA_KEY)
                                      or b"")
        assert "head.bias" in {name for listed in names.values() for name in listed}


def test_metadata_costs_less_than_a_segment_per_kind() -> None:
    data, _, _ = _file("portable")
    older = serialize(deserialize(_older_layout(data)), metadata_segment=False)
    assert len(data) < len(older)


def _older_layout(data: bytes) -> bytes:
    """The file as exirc wrote it before: a segment per kind, stack traces in the chains."""
    program = deserialize(data)
    kinds = {key: metadata.stored(program, key) for key in metadata.KINDS}
    (entry,) = [e for e in program.named_data if e.key == metadata.NAMED_DATA_KEY]
    program.named_data.remove(entry)
    program.segments.pop(entry.segment_index)
    for key, stored in kinds.items():
        if stored is not None:
            program.add_named_segment(key, zlib.compress(bytes(stored)), packed=True)
    return serialize(program, metadata_segment=False)


def test_files_of_the_older_layout_still_read() -> None:
    data, module, inputs = _file("portable")
    older = _older_layout(data)
    read = deserialize(older)
    assert metadata.NAMED_DATA_KEY not in {e.key for e in read.named_data}
    assert {io_names.NAMED_DATA_KEY, module_paths.NAMED_DATA_KEY} <= {
        e.key for e in read.named_data}
    new = deserialize(data)
    assert read.execution_plan[0].chains == new.execution_plan[0].chains  # stack traces too
    assert io_names.stored_io_names(read) == io_names.stored_io_names(new)
    assert module_paths.stored_module_paths(read) == module_paths.stored_module_paths(new)
    assert constant_names.decode(metadata.stored(read, constant_names.NAMED_DATA_KEY) or b"") \
        == constant_names.decode(metadata.stored(new, constant_names.NAMED_DATA_KEY) or b"")
    (ours,) = load(older).run("forward", list(inputs))
    torch.testing.assert_close(torch.as_tensor(ours), module(*inputs), rtol=1e-4, atol=1e-5)
    # and written again, it takes the new layout
    assert deserialize(serialize(read)).named_data[-1].key == metadata.NAMED_DATA_KEY


def test_files_with_plain_json_metadata_still_read() -> None:
    program = add_constant_program()
    program.add_named_segment(constant_names.NAMED_DATA_KEY,
                              b'{"buffers":{"1":["w"]},"format_version":1}')
    read = deserialize(serialize(program, metadata_segment=False))
    stored = metadata.stored(read, constant_names.NAMED_DATA_KEY)
    assert stored is not None and constant_names.decode(stored) == {1: ["w"]}
    merged = metadata.stored(deserialize(serialize(program)), constant_names.NAMED_DATA_KEY)
    assert merged is not None and constant_names.decode(merged) == {1: ["w"]}


def _with_document(document: object, *, raw: bytes | None = None) -> bytes:
    program = add_constant_program()
    program.execution_plan[0].chains[0].stacktrace = []
    data = raw if raw is not None else _deflate(json.dumps(document).encode())
    program.add_named_segment(metadata.NAMED_DATA_KEY, data, packed=True)
    return serialize(program, metadata_segment=False)


def _deflate(text: bytes) -> bytes:
    stream = zlib.compressobj(9, wbits=-15, zdict=metadata.DICTIONARY)
    return stream.compress(text) + stream.flush()


_FRAMES = {"frames": [["m.py", 1, "f", "x"]], "lists": [[0]]}


@pytest.mark.parametrize("document, message", [
    ({"format_version": 1, "stack_traces": {**_FRAMES, "methods": [[[0, 0]]]}},
     "2 stack traces for the 1 instructions"),
    ({"format_version": 1, "stack_traces": {**_FRAMES, "methods": [[[0], [0]]]}},
     "2 chains"),
    ({"format_version": 1, "stack_traces": {**_FRAMES, "methods": []}}, "for 0 methods"),
    ({"format_version": 1, "stack_traces": {**_FRAMES, "methods": [[[1]]]}},
     "outside a table of 1"),
    ({"format_version": 1, "stack_traces": {"frames": [["m.py", "1", "f", "x"]],
                                            "lists": [[0]], "methods": [[[0]]]}},
     "is not \\[file, line"),
    ({"format_version": 1, "stack_traces": {**_FRAMES, "methods": [[[True]]]}},
     "outside a table"),
    ({"format_version": 1, "io_names": 7}, "not an object"),
    ({"format_version": 2}, "format_version 2"),
    ([1, 2], "format_version None"),
], ids=["too many traces", "too many chains", "too few methods", "list index", "frame",
        "bool index", "member", "version", "not an object"])
def test_bad_merged_metadata_is_a_format_error_naming_the_segment(document: object,
                                                                  message: str) -> None:
    with pytest.raises(FormatError, match=message) as caught:
        deserialize(_with_document(document))
    assert caught.value.field == f"named_data[{metadata.NAMED_DATA_KEY!r}]"


def test_merged_stack_traces_read_back_into_the_chains() -> None:
    data = _with_document({"format_version": 1, "stack_traces": {**_FRAMES,
                                                                 "methods": [[[0]]]}})
    (chain,) = deserialize(data).execution_plan[0].chains
    assert chain.stacktrace == [P.FrameList([P.Frame("m.py", 1, "f", "x")])]


def test_a_bad_merged_stream_is_a_format_error() -> None:
    bomb = _deflate(b'{"format_version":1,"x":[' + b" " * (1 << 26) + b"]}")
    with pytest.raises(FormatError, match="once decompressed"):
        deserialize(_with_document(None, raw=bomb))
    with pytest.raises(FormatError, match="truncated"):
        deserialize(_with_document(None, raw=_deflate(b'{"format_version":1}')[:-3]))
    with pytest.raises(FormatError, match="unreadable exirc's metadata"):
        deserialize(_with_document(None, raw=zlib.compress(b'{"format_version":1}')))


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
        constant_names.decode(metadata.stored(deserialize(serialize(program)),
                                              constant_names.NAMED_DATA_KEY) or b"")
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
