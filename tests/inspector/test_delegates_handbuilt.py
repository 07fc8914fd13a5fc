"""`exirc inspect` on hand-built XNNPACK delegates: the cases ExecuTorch does not
write today (weights inside the payload, inline payloads, payloads without a
header, missing named data) and other backends, with figures known by hand.

The graphs are the payload tests' (`tests/serialize/xnnpack/graphs.py`); the
fully-connected one keeps two weights in the payload's constant region and
its bias in named data under "key-2".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exirc.inspector.describe import describe
from exirc.inspector.size import size_report
from exirc.serialize import program as P
from exirc.serialize import read_program_file
from exirc.serialize.writer import serialize
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.header import XnnpackHeader
from exirc.serialize.xnnpack.writer import serialize_blob
from tests.cli.test_conventions import run
from tests.programs import control_flow_program
from tests.serialize.xnnpack.graphs import GRAPHS_BY_KIND, quantized_graph, raw_payload

K = G.NodeKind
FC = GRAPHS_BY_KIND[K.FULLY_CONNECTED]  # weights [4, 8] and [3, 8] in the payload, bias named
BIAS = bytes(range(16))  # what "key-2" holds: 4 floats' worth


def xnnpack_program(payload: bytes, *, inline: bool = False,
                    named: dict[str, bytes] | None = None) -> P.Program:
    """forward(x) = one XnnpackBackend call on `payload`."""
    location = P.DataLocation.INLINE if inline else P.DataLocation.SEGMENT
    plan = P.ExecutionPlan(
        name="forward", values=[P.Tensor(P.ScalarType.FLOAT, [2, 8], [0, 1]),
                                P.Tensor(P.ScalarType.FLOAT, [2, 4], [0, 1])],
        inputs=[0], outputs=[1], chains=[P.Chain([0], [1], [P.DelegateCall(0, [0, 1])])],
        delegates=[P.BackendDelegate("XnnpackBackend",
                                     P.BackendDelegateDataReference(location, 0))])
    program = P.Program(execution_plan=[plan])
    if inline:
        program.backend_delegate_data.append(P.BackendDelegateInlineData(payload))
    else:
        program.segments.append(P.DataSegment(payload))
    for key, data in (named if named is not None else {"key-2": BIAS}).items():
        program.add_named_segment(key, data)
    return program


def facts(data: bytes) -> dict:
    (method,) = describe(read_program_file(data))["methods"]
    (delegate,) = method["delegates"]
    return delegate


def rows(data: bytes) -> dict[str, tuple[str, int]]:
    report = size_report(data)
    assert sum(row.nbytes for row in report.rows) == len(data) == report.file_size
    return {row.item: (row.kind, row.nbytes) for row in report.rows}


def test_weights_in_the_payload_and_in_named_data() -> None:
    payload = serialize_blob(FC)
    data = serialize(xnnpack_program(payload))
    x = facts(data)["xnnpack"]
    assert x["nodes"] == 2 and x["node_kinds"] == {"fully_connected": 2}
    assert x["fused_activations"] == 1
    assert x["values"] == {"count": 6, "inputs": 1, "outputs": 2, "constants": 3,
                           "internal": 0}
    assert x["weights"] == {"count": 3, "bytes": 4 * 8 * 4 + 3 * 8 * 4 + 16,
                            "named_data_bytes": 16, "payload_bytes": 4 * 8 * 4 + 3 * 8 * 4,
                            "shared_bytes": 0, "missing_named_keys": []}
    header = XnnpackHeader.parse(payload)
    assert header is not None
    assert x["layout"] == {"header_bytes": 30, "flatbuffer_bytes": header.flatbuffer_size,
                           "constant_region_bytes": len(FC.constant_region)}

    found = rows(data)
    assert found["forward delegate[0]: weight at 0: fp32[4, 8] fully_connected filter"] == \
        ("delegate_weight", 128)
    assert found["forward delegate[0]: weight at 128: fp32[3, 8] fully_connected filter"] == \
        ("delegate_weight", 96)
    assert found["weight 'key-2': fp32[4] fully_connected bias"] == ("delegate_weight", 16)
    assert found["forward delegate[0]: payload header"] == ("delegate_header", 30)
    payload_rows = [(kind, n) for item, (kind, n) in found.items()
                    if item.startswith("forward delegate[0]: ")]
    assert sum(n for _, n in payload_rows) == len(payload)  # every payload byte is its own
    assert not any(kind == "named_data" for kind, _ in found.values())


def test_an_inline_payload_is_attributed_inside_the_program() -> None:
    payload = serialize_blob(FC)
    data = serialize(xnnpack_program(payload, inline=True))
    report = size_report(data)
    assert sum(row.nbytes for row in report.rows) == len(data)
    inside = [r for r in report.rows if r.group == "program (FlatBuffer)"
              and r.item.startswith("forward delegate[0]: ")]
    assert sum(r.nbytes for r in inside) == len(payload)
    assert {r.kind for r in inside} >= {"delegate_header", "delegate_graph", "delegate_weight"}
    assert not any(r.item.startswith("inline delegate data 0") for r in report.rows)
    assert facts(data)["location"] == "inline"


def test_a_payload_without_header() -> None:
    blob = GRAPHS_BY_KIND[K.STATIC_TRANSPOSE]  # no constants: a bare FlatBuffer holds it all
    payload = raw_payload(blob, headed=False)
    data = serialize(xnnpack_program(payload, named={}))
    x = facts(data)["xnnpack"]
    assert x["node_kinds"] == {"static_transpose": 1}
    assert x["layout"] == {"header_bytes": 0, "flatbuffer_bytes": len(payload),
                           "constant_region_bytes": 0}
    found = rows(data)
    assert "forward delegate[0]: payload header" not in found
    assert sum(n for item, (_, n) in found.items()
               if item.startswith("forward delegate[0]: ")) == len(payload)


def test_quantized_graph_counts_scales_as_weights() -> None:
    blob = quantized_graph()
    named = {e.named_key: bytes(e.size) for e in blob.graph.constant_data if e.is_named}
    data = serialize(xnnpack_program(serialize_blob(blob), named=named))
    x = facts(data)["xnnpack"]
    entries = blob.graph.constant_data[1:]  # each read once: as a weight or as scales
    assert x["weights"]["count"] == len(entries)
    assert x["weights"]["bytes"] == sum(e.size for e in entries)
    assert set(x["datatypes"]) == {"qint8", "qcint8", "qcint32", "fp32", "qdint8", "qbint4"}
    items = [r.item for r in size_report(data).rows if r.kind == "delegate_weight"]
    assert any("scales of conv2d bias" in item for item in items), items


def test_a_missing_named_weight_is_reported(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    path = tmp_path / "missing.pte"
    path.write_bytes(serialize(xnnpack_program(serialize_blob(FC), named={})))
    assert facts(path.read_bytes())["xnnpack"]["weights"]["missing_named_keys"] == ["key-2"]
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 0, err
    assert "1 named key missing from the program's named data" in out


def test_an_unreadable_payload_is_one_line(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    path = tmp_path / "garbage.pte"
    path.write_bytes(serialize(xnnpack_program(b"\0\0\0\0XH99 not a payload")))
    code, out, err = run(capsys, "inspect", str(path), "--show", "summary", "--show",
                         "instructions", "--show", "size")
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if "unreadable" in ln and "payload:" in ln]
    assert line.strip().startswith("unreadable XNNPACK payload: header.magic: bytes 4..8")
    assert "delegate[0] XnnpackBackend(%0, %1) {unreadable XNNPACK payload}" in out
    assert "delegate XnnpackBackend data" in out  # the size report: one row for it
    # key-2 is read by nothing now: plain named data again.
    assert "named data 'key-2'" in out
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    (delegate,) = json.loads(out)["methods"][0]["delegates"]
    assert delegate["xnnpack"] is None
    assert delegate["payload_error"].startswith("header.magic: ")


def test_other_backends_show_size_and_compile_specs(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    path = tmp_path / "control.pte"
    path.write_bytes(serialize(control_flow_program()))
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 0, err
    assert "    [0] ExampleBackend: 14 B (inline 0), compile specs: level\n" in out
    assert "XNNPACK" not in out
    code, out, _ = run(capsys, "inspect", str(path), "--json", "--method", "choose")
    (delegate,) = json.loads(out)["methods"][0]["delegates"]
    assert "xnnpack" not in delegate and "payload_error" not in delegate
