"""`exirc inspect` on programs ExecuTorch delegated to XNNPACK: what a payload
holds, in the summary, the listing, the size report and the JSON.

ExecuTorch's XnnpackPartitioner lowers the models once per session (into a
temporary folder, never the repository); without ExecuTorch the tests skip.
The figures are checked against `deserialize_blob` (what the payload says)
and against the model (its parameters are the delegate's weights).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from exirc.serialize import program as P
from exirc.serialize import read_program_file
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests.cli.test_conventions import run
from tests.oracle import requires_executorch

pytestmark = [requires_executorch, pytest.mark.oracle]


class ConvReluLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(x.flatten(1))


class SharedLinear(torch.nn.Module):
    """One linear used twice around an op XNNPACK does not take (cumsum): two
    delegates reading the same weights, which ExecuTorch stores once."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cumsum(self.fc(x), 1))


@dataclass
class Lowered:
    path: Path
    data: bytes
    program: P.Program
    parameter_bytes: int

    def payloads(self) -> list[bytes]:
        return [bytes(self.program.segments[d.processed.index].data)
                for plan in self.program.execution_plan for d in plan.delegates]


def _lower(model: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path) -> Lowered:
    partition = pytest.importorskip("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    exir = pytest.importorskip("executorch.exir")
    edge = exir.to_edge_transform_and_lower(torch.export.export(model, args),
                                            partitioner=[partition.XnnpackPartitioner()])
    data = bytes(edge.to_executorch().buffer)
    path.write_bytes(data)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return Lowered(path, data, read_program_file(data).program, parameter_bytes)


@pytest.fixture(scope="session")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Lowered]:
    folder = tmp_path_factory.mktemp("inspect_delegates")
    torch.manual_seed(0)
    return {
        "conv": _lower(ConvReluLinear().eval(), (torch.randn(1, 3, 8, 8),), folder / "conv.pte"),
        "shared": _lower(SharedLinear().eval(), (torch.randn(2, 8),), folder / "shared.pte"),
    }


def inspect_json(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> dict[str, Any]:
    code, out, err = run(capsys, "inspect", str(path), "--json", *args)
    assert code == 0, err
    info: dict[str, Any] = json.loads(out)
    return info


def reader_facts(payload: bytes) -> tuple[G.XNNGraph, int]:
    """The graph, and the bytes of the distinct constants its values read."""
    graph = deserialize_blob(payload).graph
    entries = {graph.constant_data[v.constant_buffer_idx].named_key
               or (graph.constant_data[v.constant_buffer_idx].offset,)
               : graph.constant_data[v.constant_buffer_idx].size
               for v in graph.values if v.constant_buffer_idx}
    return graph, sum(entries.values())


def test_json_facts_match_the_reader_and_the_model(capsys: pytest.CaptureFixture[str],
                                                   lowered: dict[str, Lowered]) -> None:
    conv = lowered["conv"]
    (payload,) = conv.payloads()
    graph, weight_bytes = reader_facts(payload)
    info = inspect_json(capsys, conv.path)
    (delegate,) = info["methods"][0]["delegates"]
    assert delegate["id"] == "XnnpackBackend" and delegate["payload_error"] is None
    assert delegate["bytes"] == len(payload)
    x = delegate["xnnpack"]
    assert x["nodes"] == len(graph.nodes)
    assert x["node_kinds"] == dict(Counter(n.kind.name.lower() for n in graph.nodes))
    assert x["node_kinds"]["conv2d"] == 2 and x["node_kinds"]["fully_connected"] == 1
    assert x["fused_activations"] == 2  # each relu became its conv's output clamp
    values = x["values"]
    assert values["count"] == len(graph.values)
    assert (values["inputs"], values["outputs"], values["constants"]) == (1, 1, 6)
    assert sum(values[k] for k in ("inputs", "outputs", "constants", "internal")) == \
        values["count"]
    assert x["datatypes"] == {"fp32": len(graph.values)}
    # The weights are the model's parameters, all in named data.
    assert x["weights"]["count"] == 6
    assert x["weights"]["bytes"] == weight_bytes == conv.parameter_bytes
    assert x["weights"]["named_data_bytes"] == conv.parameter_bytes
    assert x["weights"]["payload_bytes"] == 0 and x["weights"]["missing_named_keys"] == []
    # The named data it reads is delegate data, not "other segments".
    size = info["size"]
    assert size["other_segments"] == 0
    assert size["delegate_data"] >= len(payload) + conv.parameter_bytes
    parts = ("program", "constants", "delegate_data", "other_segments", "padding")
    assert sum(size[k] for k in parts) == size["total"] == len(conv.data)
    named = [s for s in info["file"]["segments"] if s["role"] == "named_data"]
    assert len(named) == 6
    assert all(s["weights_of"] == [{"method": "forward", "delegate": 0}] for s in named)


def test_summary_and_listing_text(capsys: pytest.CaptureFixture[str],
                                  lowered: dict[str, Lowered]) -> None:
    conv = lowered["conv"]
    graph, _ = reader_facts(conv.payloads()[0])
    kinds = Counter(n.kind.name.lower() for n in graph.nodes)
    code, out, err = run(capsys, "inspect", str(conv.path), "--show", "summary",
                         "--show", "instructions")
    assert code == 0, err
    kinds_text = ", ".join(k if n == 1 else f"{k} ×{n}" for k, n in sorted(kinds.items()))
    assert f"        {len(graph.nodes)} XNNPACK nodes: {kinds_text} " \
           "(2 with a fused activation)\n" in out
    assert f"        {len(graph.values)} values: 1 input, 1 output, 6 constants, " \
           f"{len(graph.values) - 8} internal; datatypes: fp32 ×{len(graph.values)}\n" in out
    assert f"        weights: 6 tensors, 23.2 KiB ({conv.parameter_bytes:,} B) " \
           "in named data\n" in out
    assert f"  0  delegate[0] XnnpackBackend(%0, %1) {{{len(graph.nodes)} XNNPACK nodes}}\n" \
           in out
    assert "(named_data: weights of forward delegate[0])" in out


def test_size_report_charges_payload_and_weights(capsys: pytest.CaptureFixture[str],
                                                 lowered: dict[str, Lowered]) -> None:
    conv = lowered["conv"]
    (payload,) = conv.payloads()
    size = inspect_json(capsys, conv.path, "--show", "size")["size"]
    rows = size["rows"]
    assert sum(r["bytes"] for r in rows) == size["total"] == len(conv.data)
    weights = [r for r in rows if r["kind"] == "delegate_weight"]
    assert sum(r["bytes"] for r in weights) == conv.parameter_bytes
    assert {r["group"] for r in weights} == {"forward delegate[0] XnnpackBackend: "
                                             "weights (named data)"}
    # Each weight row is the segment its key names; keys are the sha256 of the bytes.
    named = {n.key: n.segment_index for n in conv.program.named_data}
    for row in weights:
        assert row["segment"] == named[row["named_key"]]
        stored = bytes(conv.program.segments[row["segment"]].data)[:row["bytes"]]
        assert hashlib.sha256(stored).hexdigest() == row["named_key"]
    filters = sorted(r["type"] for r in weights if r["role"].endswith("filter"))
    assert filters == ["fp32[10, 512]", "fp32[8, 3, 3, 3]", "fp32[8, 3, 3, 8]"]
    payload_rows = [r for r in rows if r["group"] == "segment 1: delegate:XnnpackBackend"]
    assert sum(r["bytes"] for r in payload_rows) == len(payload)
    kinds = Counter(r["kind"] for r in payload_rows)
    assert kinds["delegate_header"] == 1 and kinds["delegate_graph"] == 4
    assert not [r for r in rows if r["kind"] == "named_data"]


def test_a_weight_two_delegates_read_is_counted_once(capsys: pytest.CaptureFixture[str],
                                                     lowered: dict[str, Lowered]) -> None:
    shared = lowered["shared"]
    info = inspect_json(capsys, shared.path, "--show", "size")
    first, second = info["methods"][0]["delegates"]
    for delegate in (first, second):
        assert delegate["xnnpack"]["weights"]["bytes"] == shared.parameter_bytes
        assert delegate["xnnpack"]["weights"]["shared_bytes"] == shared.parameter_bytes
    rows = info["size"]["rows"]
    assert sum(r["bytes"] for r in rows) == len(shared.data)
    weights = [r for r in rows if r["kind"] == "delegate_weight"]
    assert sum(r["bytes"] for r in weights) == shared.parameter_bytes  # once, not twice
    assert all(r["delegate"] == 0 and r["shared_with"] == ["forward delegate[1]"]
               for r in weights)
    code, out, _ = run(capsys, "inspect", str(shared.path), "--show", "size")
    assert code == 0 and "shared with forward delegate[1]" in out


def _flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0xFF
    return bytes(out)


def test_a_corrupted_payload_is_shown_and_the_rest_still_inspects(
        capsys: pytest.CaptureFixture[str], lowered: dict[str, Lowered], tmp_path: Path) -> None:
    conv = lowered["conv"]
    (start, size) = read_program_file(conv.data).segment_spans[1]  # the payload's segment
    path = tmp_path / "corrupt.pte"
    path.write_bytes(_flip(_flip(conv.data, start + 4), start + 5))  # its header magic
    code, out, err = run(capsys, "inspect", str(path), "--show", "summary", "--show",
                         "instructions", "--show", "size")
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if "unreadable XNNPACK payload:" in ln]
    assert "header.magic" in line
    assert "{unreadable XNNPACK payload}" in out
    assert "memory plan: 1 buffer" in out and "size of " in out  # the rest is there
    info = inspect_json(capsys, path, "--show", "size")
    (delegate,) = info["methods"][0]["delegates"]
    assert delegate["xnnpack"] is None and "header.magic" in delegate["payload_error"]
    assert sum(r["bytes"] for r in info["size"]["rows"]) == len(conv.data)

    # Any byte of the payload flipped: inspect still answers, in every view.
    unreadable = 0
    for position in range(start, start + size, 11):
        path.write_bytes(_flip(conv.data, position))
        for args in (["--show", "summary", "--show", "instructions", "--show", "size"],
                     ["--json", "--show", "size"]):
            code, out, err = run(capsys, "inspect", str(path), *args)
            assert code == 0, (position - start, err)
        unreadable += '"payload_error": null' not in out
    assert unreadable > 0  # some flips were caught by the reader, so both paths ran
