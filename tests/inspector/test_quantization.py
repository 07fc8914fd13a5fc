"""`exirc inspect` on quantized programs: which tensors are quantized, and how.

ExecuTorch writes the files once per module, into a temporary folder (never
the repository): a conv + linear model quantized with torchao's PT2E flow
and XNNPACKQuantizer (per-channel weights), as portable kernel calls and
lowered to XNNPACK, and embeddings with packed 4-bit group-wise and 8-bit
per-row weights. What inspect reports is checked against the exported
graph's quantize/dequantize arguments. Hand-built programs give figures
known by hand, and the malformed calls and payloads a hostile file may hold;
they need no ExecuTorch.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from exirc.inspector.delegates import Payload
from exirc.inspector.describe import describe
from exirc.inspector.quantization import KERNELS, quantization_facts
from exirc.inspector.quantization_text import render_quantization
from exirc.inspector.quantization_xnnpack import payload_tensors
from exirc.inspector.render import render_summary
from exirc.serialize import program as P
from exirc.serialize import read_program_file
from exirc.serialize.program import CONSTANT_ALIGNMENT
from exirc.serialize.writer import serialize
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.writer import serialize_blob
from tests.cli.test_conventions import run
from tests.inspector.test_delegates_handbuilt import xnnpack_program
from tests.oracle import requires_executorch
from tests.serialize.xnnpack.graphs import quantized_graph


def inspect_json(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> dict[str, Any]:
    code, out, err = run(capsys, "inspect", str(path), "--json", *args)
    assert code == 0, err
    info: dict[str, Any] = json.loads(out)
    return info


def inspect_text(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> str:
    code, out, err = run(capsys, "inspect", str(path), *args)
    assert code == 0, err
    return out


# ==========================================================================
# A hand-built program: figures known by hand
# ==========================================================================


def _tensor(dtype: P.ScalarType, sizes: list[int], *, offset: int | None = None,
            constant: int = 0) -> P.Tensor:
    planned = None if offset is None else P.AllocationDetails.at(1, offset)
    return P.Tensor(dtype, sizes, list(range(len(sizes))), data_buffer_idx=constant,
                    allocation_info=planned)


def quantized_program() -> P.Program:
    """forward(x) quantizes x per tensor and dequantizes it, and dequantizes an
    int8 weight per channel (constant scales [0.5, 0.25, 0.125], zero points
    [0, 1, -1])."""
    f32, i8 = P.ScalarType.FLOAT, P.ScalarType.CHAR
    values: list[P.EValue] = [
        _tensor(f32, [2, 3], offset=0),                     # %0 x
        P.Double(0.5), P.Int(3),                            # %1 scale, %2 zero point
        P.Int(-128), P.Int(127), P.Int(int(i8)),            # %3, %4 range, %5 dtype
        _tensor(i8, [2, 3], offset=32),                     # %6 x quantized
        _tensor(f32, [3], constant=1),                      # %7 channel scales
        _tensor(P.ScalarType.LONG, [3], constant=2),        # %8 channel zero points
        P.Int(0),                                           # %9 axis
        _tensor(i8, [3, 4], constant=3),                    # %10 weight
        _tensor(f32, [3, 4], offset=48),                    # %11 weight dequantized
        P.Null(),                                           # %12 out_dtype
        _tensor(f32, [2, 3], offset=96),                    # %13 x dequantized
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(0, [0, 1, 2, 3, 4, 5, 6, 6]),
        P.KernelCall(1, [6, 1, 2, 3, 4, 5, 12, 13, 13]),
        P.KernelCall(2, [10, 7, 8, 9, 3, 4, 5, 12, 11, 11]),
    ]
    operators = [P.Operator(f"quantized_decomposed::{name}", "out") for name in
                 ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel")]
    plan = P.ExecutionPlan(name="forward", values=values, inputs=[0], outputs=[13, 11],
                           chains=[P.Chain([0], [13, 11], instructions)], operators=operators,
                           non_const_buffer_sizes=[0, 128])
    buffers = [b"", struct.pack("<3f", 0.5, 0.25, 0.125), struct.pack("<3q", 0, 1, -1),
               bytes(12)]
    segment, offsets = P.pack_subsegments(buffers, CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


@pytest.fixture
def handbuilt_pte(tmp_path: Path) -> Path:
    path = tmp_path / "quantized.pte"
    path.write_bytes(serialize(quantized_program()))
    return path


HANDBUILT_VIEW = """\
quantization: 2 quantized tensors
  method forward, kernel calls (2):
    %6   i8[2, 3]  per-tensor          scale=0.5            zp=3         [-128, 127]  \
quantize_per_tensor.out @0 -> dequantize_per_tensor.out @1
    %10  i8[3, 4]  per-channel axis 0  3 scales 0.125..0.5  3 zps -1..1  [-128, 127]  \
constant -> dequantize_per_channel.out @2
"""


def cells(text: str) -> list[list[str]]:
    """The rows of `--show quantization`, split into their columns."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()
            if line.startswith("    ")]


@pytest.mark.smoke
def test_handbuilt_view_and_summary(capsys: pytest.CaptureFixture[str],
                                    handbuilt_pte: Path) -> None:
    assert inspect_text(capsys, handbuilt_pte, "--show", "quantization") == HANDBUILT_VIEW
    # The listing says what the per-channel call's tensors hold; the
    # per-tensor calls show their literals already.
    listing = inspect_text(capsys, handbuilt_pte, "--show", "instructions").splitlines()
    assert listing[-1].endswith(
        "dequantize_per_channel.out(%10, %7, %8, 0, -128, 127, 1, None, out=%11) "
        "{per-channel axis 0: 3 scales 0.125..0.5, 3 zps -1..1}")
    assert not any("{" in line for line in listing[:-1])
    summary = inspect_text(capsys, handbuilt_pte)
    assert summary.endswith("quantization: 2 quantized tensors (per-channel, per-tensor; "
                            "see --show quantization)\n")


def test_the_view_does_not_import_torch(handbuilt_pte: Path) -> None:
    """The inspector reads files where torch is not wanted (the CLI's other
    commands are not this test's business)."""
    probe = ("import sys\n"
             "from exirc.inspector.describe import describe\n"
             "from exirc.inspector.quantization_text import render_quantization\n"
             "from exirc.serialize import read_program_file\n"
             "info = describe(read_program_file(open(sys.argv[1], 'rb').read()))\n"
             "assert 'per-channel' in render_quantization(info, str)\n"
             "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", probe, str(handbuilt_pte)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_handbuilt_json(capsys: pytest.CaptureFixture[str], handbuilt_pte: Path) -> None:
    info = inspect_json(capsys, handbuilt_pte)
    assert info["format_version"] == 1  # a key added within the version
    quantization = info["quantization"]
    assert quantization["count"] == 2
    per_tensor, per_channel = quantization["tensors"]
    assert per_tensor == {
        "method": "forward", "delegate": None, "value": 6, "xnnpack_value": None,
        "type": "i8[2, 3]", "dtype": "i8", "scheme": "per_tensor", "dynamic": False,
        "axis": None, "group_size": None,
        "scale": {"source": "literal", "value": None, "shape": None, "count": 1,
                  "values": [0.5], "min": 0.5, "max": 0.5},
        "zero_point": {"source": "literal", "value": None, "shape": None, "count": 1,
                       "values": [3], "min": 3, "max": 3},
        "quant_min": -128, "quant_max": 127, "origin": "computed",
        "uses": [{"chain": 0, "index": 0, "op": "quantized_decomposed::quantize_per_tensor.out",
                  "arg": "output", "writes": True},
                 {"chain": 0, "index": 1,
                  "op": "quantized_decomposed::dequantize_per_tensor.out", "arg": "input",
                  "writes": False}]}
    assert (per_channel["value"], per_channel["scheme"], per_channel["axis"]) == \
        (10, "per_channel", 0)
    assert per_channel["scale"] == {"source": "constant", "value": 7, "shape": [3], "count": 3,
                                    "values": [0.5, 0.25, 0.125], "min": 0.125, "max": 0.5}
    assert per_channel["zero_point"]["values"] == [0, 1, -1]
    assert per_channel["origin"] == "constant"


def test_float_program_reports_none(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tests.programs import add_constant_program

    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    assert inspect_json(capsys, path)["quantization"] == {"count": 0, "tensors": []}
    assert "quantization:" not in inspect_text(capsys, path)
    assert inspect_text(capsys, path, "--show", "quantization") == \
        "quantization: none (no quantized kernel calls or XNNPACK values)\n"


def test_handbuilt_xnnpack_payload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Inline channel scales, named channel scales, bf16 block scales in the
    payload's region, dynamic activations and an input quantized as it runs."""
    blob = quantized_graph()
    named = {e.named_key: struct.pack("<3f", 0.5, 0.25, 2.0)
             for e in blob.graph.constant_data if e.is_named}
    path = tmp_path / "xnnpack.pte"
    path.write_bytes(serialize(xnnpack_program(serialize_blob(blob), named=named)))
    tensors = inspect_json(capsys, path)["quantization"]["tensors"]
    by_type = {t["type"]: t for t in tensors}
    assert all(t["delegate"] == 0 and t["value"] is None for t in tensors)
    conv_filter = by_type["qcint8[3, 1, 1, 2]"]
    assert conv_filter["scale"]["source"] == "literal"
    assert conv_filter["scale"]["values"] == [0.5, 0.25, 2.0]
    bias = by_type["qcint32[3]"]
    assert (bias["scale"]["source"], bias["scale"]["values"]) == ("constant", [0.5, 0.25, 2.0])
    assert bias["zero_point"]["source"] == "implicit"
    blocks = by_type["qbint4[4, 32]"]
    assert (blocks["scheme"], blocks["group_size"], blocks["scale"]["count"]) == \
        ("per_group", 16, 8)
    assert (blocks["quant_min"], blocks["quant_max"]) == (-8, 7)
    # bf16 block scales: the top halves of float32s.
    (quant,) = [v.quant for v in blob.graph.values if v.datatype == G.Datatype.QBINT4]
    assert isinstance(quant, G.PerChannelGroupQuant)
    entry = blob.graph.constant_data[quant.scale_buffer_idx]
    raw = bytes(blob.constant_region)[entry.offset:entry.offset + 16]
    block_scales = [struct.unpack("<f", struct.pack("<I", half << 16))[0]
                    for half in struct.unpack("<8H", raw)]
    assert blocks["scale"]["values"] == block_scales
    dynamic = by_type["qdint8[2, 32]"]
    assert (dynamic["scheme"], dynamic["dynamic"], dynamic["scale"]["source"]) == \
        ("per_token", True, "run_time")
    runs_quantized = by_type["fp32[2, 8]"]
    assert (runs_quantized["dtype"], runs_quantized["dynamic"]) == ("qint8", True)
    text = inspect_text(capsys, path, "--show", "quantization")
    rows = {row[1]: row[2:] for row in cells(text)}
    assert rows["qint8[1, 4, 4, 2]"][:4] == ["per-tensor", "scale=0.125", "zp=-3", "[-128, 127]"]
    assert rows["qdint8[2, 32]"][:3] == ["dynamic per-token", "scale=(run time)",
                                         "zp=(run time)"]
    assert rows["qbint4[4, 32]"][:4] == [
        "per-group size 16", f"8 scales {min(block_scales):.6g}..{max(block_scales):.6g}",
        "zp=0", "[-8, 7]"]
    assert rows["fp32[2, 8]"][0] == "dynamic"

    # The named scales missing from the program: their count, and `?` for values.
    path.write_bytes(serialize(xnnpack_program(serialize_blob(blob), named={})))
    bias = {t["type"]: t for t in inspect_json(capsys, path)["quantization"]["tensors"]
            }["qcint32[3]"]
    assert bias["scale"] == {"source": "constant", "value": None, "shape": None, "count": 3,
                             "values": None, "min": None, "max": None}
    missing = cells(inspect_text(capsys, path, "--show", "quantization"))
    assert [row[3:5] for row in missing if row[1] == "qcint32[3]"] == [["3 scales ?", "zp=0"]]


# ==========================================================================
# Malformed calls and payloads: shown with `?`, never raised
# ==========================================================================


def _facts_and_text(program: P.Program) -> tuple[dict[str, Any], str]:
    facts = quantization_facts(program)
    json.dumps(facts, allow_nan=False)  # strict JSON: jq must read it
    return facts, render_quantization({"quantization": facts, "methods": []}, str)


def test_odd_arguments_are_unknown_not_errors() -> None:
    """Every argument of every call pointed at every kind of value, every call
    cut short, and every call renamed to every quantized kernel."""
    base = quantized_program()
    odd: list[P.EValue] = [P.String("x"), P.IntList([]), P.DoubleList([math.nan]),
                           P.BoolList([True]), P.TensorList([0]), P.Int(2 ** 62), P.Int(-1),
                           P.Double(math.inf), P.Int(999)]
    base.execution_plan[0].values.extend(odd)
    count = len(base.execution_plan[0].values)
    unknown = 0
    for i, instr in enumerate(base.execution_plan[0].chains[0].instructions):
        assert isinstance(instr, P.KernelCall)
        variants: list[list[int]] = [instr.args[:k] for k in range(len(instr.args))]
        for position in range(len(instr.args)):
            for target in range(count):
                args = list(instr.args)
                args[position] = target
                variants.append(args)
        for args in variants:
            program = copy.deepcopy(base)
            program.execution_plan[0].chains[0].instructions[i] = P.KernelCall(i, args)
            _, text = _facts_and_text(program)
            unknown += "?" in text
    assert unknown > 100  # the odd values did reach the view
    for name in KERNELS:
        program = copy.deepcopy(base)
        for operator in program.execution_plan[0].operators:
            operator.name = f"quantized_decomposed::{name}"
        _facts_and_text(program)


def test_odd_constants_are_unknown_not_errors() -> None:
    """The channel scales' tensor changed under the call: what can be read is."""
    external = P.ExtraTensorInfo(location=P.TensorDataLocation.EXTERNAL)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"scalar_type": P.ScalarType.BOOL}, "3 scales ?"),  # not numbers
        ({"scalar_type": P.ScalarType.HALF}, "3 scales 0..1.75"),  # float32 bytes as halves
        ({"sizes": [0]}, "0 scales ?"),
        ({"sizes": [10 ** 6]}, "1000000 scales ?"),  # more than the constant holds
        ({"sizes": []}, "scale=0.5"),  # a 0-d tensor: its first number
        ({"data_buffer_idx": 99}, "3 scales ?"),
        ({"extra_tensor_info": external}, "scale=(external data)"),
        ({"allocation_info": P.AllocationDetails.at(1, 0)}, "scale=%7"),  # written as it runs
    ]
    for change, shown in cases:
        program = quantized_program()
        scales = program.execution_plan[0].values[7]
        assert isinstance(scales, P.Tensor)
        for key, value in change.items():
            setattr(scales, key, value)
        facts, text = _facts_and_text(program)
        assert facts["count"] == 2, change
        assert cells(text)[1][3] == shown, change


def test_odd_xnnpack_values_are_unknown_not_errors() -> None:
    """Parameters the payload validator refuses today, straight into the
    inspector: it must not rely on the validator to stay up."""
    changes: list[dict[str, Any]] = [
        {"channel_dim": 99}, {"channel_dim": -1}, {"group_size": 0}, {"group_size": -3},
        {"group_size": 7}, {"scale_buffer_idx": 999}, {"scale": []}, {"scale": [math.nan]},
        {"num_scales": 2 ** 40}, {"scale": [math.inf, 1.0]}, {"zero_point": 10 ** 12},
    ]
    delegate = P.BackendDelegate("XnnpackBackend",
                                 P.BackendDelegateDataReference(P.DataLocation.SEGMENT, 0))
    seen = 0
    for change in changes:
        for dims in (None, [], [0, 0], [2 ** 31, 3]):
            blob = quantized_graph()
            for value in blob.graph.values:
                if dims is not None:
                    value.dims = list(dims)
                for key, new in change.items():
                    if isinstance(value.quant, G.PerTensorQuant) and key == "scale":
                        new = new[0] if new else -0.0  # a float, not a list
                    if value.quant is not None and hasattr(value.quant, key):
                        setattr(value.quant, key, new)
                        seen += 1
            blob.graph.values.append(G.TensorValue(99, [2], 1000))  # type: ignore[arg-type]
            payload = Payload("forward", 0, delegate, memoryview(b""), blob)
            tensors = [t.to_json() for t in payload_tensors(payload, {})]
            json.dumps(tensors, allow_nan=False)
            render_quantization({"quantization": {"tensors": tensors}, "methods": []}, str)
    assert seen > 50


# ==========================================================================
# ExecuTorch's quantized programs
# ==========================================================================


class ConvLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class Embeddings(torch.nn.Module):
    """A packed 4-bit table with 4 groups of scales per row (32 columns: groups
    of 8) and an 8-bit one with a scale per row."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.register_buffer("w4", torch.randint(0, 256, (10, 16), dtype=torch.uint8,
                                                 generator=generator))
        self.register_buffer("s4", torch.rand(10, 4, generator=generator) + 0.01)
        self.register_buffer("w8", torch.randint(-128, 128, (10, 32), dtype=torch.int8,
                                                 generator=generator))
        self.register_buffer("s8", torch.rand(10, generator=generator) + 0.01)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.quantized_decomposed
        return ops.embedding_4bit.default(self.w4, self.s4, None, -8, 7, indices) + \
            ops.embedding_byte.default(self.w8, self.s8, None, -128, 127, indices)


@dataclass
class Built:
    portable: Path
    xnnpack: Path
    embeddings: Path
    float_model: Path
    # From the exported graph: each quantize_per_tensor's (scale, zero point, min, max),
    # and each dequantize_per_channel's (scales, zero points, axis, min, max).
    per_tensor: list[tuple[float, int, int, int]]
    per_channel: list[tuple[list[float], list[int], int, int, int]]
    module: Embeddings


def _graph_constant(ep: torch.export.ExportedProgram, node: Any) -> torch.Tensor:
    signature = ep.graph_signature
    for names in (signature.inputs_to_parameters, signature.inputs_to_buffers,
                  signature.inputs_to_lifted_tensor_constants):
        if node.name in names:
            name = names[node.name]
            found = ep.state_dict[name] if name in ep.state_dict else ep.constants[name]
            assert isinstance(found, torch.Tensor)
            return found
    raise KeyError(node.name)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    quantizer_module = pytest.importorskip(
        "executorch.backends.xnnpack.quantizer.xnnpack_quantizer")
    partitioner = pytest.importorskip("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    exir = pytest.importorskip("executorch.exir")
    importlib.import_module("executorch.kernels.quantized")  # the kernels' out variants
    importlib.import_module("executorch.exir.passes._quant_patterns_and_replacements")
    folder = tmp_path_factory.mktemp("inspect_quantization")
    torch.manual_seed(0)
    model, args = ConvLinear().eval(), (torch.randn(1, 3, 6, 6),)
    quantizer = quantizer_module.XNNPACKQuantizer().set_global(
        quantizer_module.get_symmetric_quantization_config(is_per_channel=True))
    prepared = pt2e.prepare_pt2e(torch.export.export(model, args).module(), quantizer)
    prepared(*args)
    ep = torch.export.export(pt2e.convert_pt2e(prepared), args)
    ops = torch.ops.quantized_decomposed
    per_tensor = [(n.args[1], n.args[2], n.args[3], n.args[4]) for n in ep.graph.nodes
                  if n.target == ops.quantize_per_tensor.default]
    per_channel = [(_graph_constant(ep, n.args[1]).tolist(),
                    _graph_constant(ep, n.args[2]).tolist(), n.args[3], n.args[4], n.args[5])
                   for n in ep.graph.nodes if n.target == ops.dequantize_per_channel.default]

    def write(name: str, data: bytes) -> Path:
        path = folder / name
        path.write_bytes(data)
        return path

    embeddings = Embeddings()
    return Built(
        portable=write("portable.pte", exir.to_edge(ep).to_executorch().buffer),
        xnnpack=write("xnnpack.pte", exir.to_edge_transform_and_lower(
            ep, partitioner=[partitioner.XnnpackPartitioner()]).to_executorch().buffer),
        embeddings=write("embeddings.pte", exir.to_edge(torch.export.export(
            embeddings, (torch.tensor([1, 3, 5]),))).to_executorch().buffer),
        float_model=write("float.pte", exir.to_edge(torch.export.export(
            model, args)).to_executorch().buffer),
        per_tensor=per_tensor, per_channel=per_channel, module=embeddings)


@requires_executorch
@pytest.mark.oracle
def test_portable_reports_the_graphs_parameters(capsys: pytest.CaptureFixture[str],
                                                built: Built) -> None:
    tensors = inspect_json(capsys, built.portable)["quantization"]["tensors"]
    assert all(t["delegate"] is None and t["dtype"] == "i8" for t in tensors)
    # Each quantize_per_tensor of the graph is one tensor, written by the
    # quantize call and read by its dequantize.
    per_tensor = [t for t in tensors if t["scheme"] == "per_tensor"]
    assert len(per_tensor) == len(built.per_tensor) == 4
    assert sorted((t["scale"]["values"][0], t["zero_point"]["values"][0], t["quant_min"],
                   t["quant_max"]) for t in per_tensor) == sorted(built.per_tensor)
    for t in per_tensor:
        assert [(u["op"].split("::")[1], u["writes"]) for u in t["uses"]] == \
            [("quantize_per_tensor.out", True), ("dequantize_per_tensor.out", False)]
        assert t["origin"] == "computed"
    # The weights: per channel, with the graph's scales and zero points.
    per_channel = [t for t in tensors if t["scheme"] == "per_channel"]
    assert len(per_channel) == len(built.per_channel) == 2
    assert sorted((t["scale"]["values"], t["zero_point"]["values"], t["axis"], t["quant_min"],
                   t["quant_max"]) for t in per_channel) == sorted(built.per_channel)
    assert {t["type"] for t in per_channel} == {"i8[4, 3, 3, 3]", "i8[5, 64]"}
    assert all(t["origin"] == "constant" and t["scale"]["source"] == "constant"
               for t in per_channel)

    rows = cells(inspect_text(capsys, built.portable, "--show", "quantization"))
    assert sorted(row[2:5] for row in rows if row[2] == "per-tensor") == sorted(
        ["per-tensor", f"scale={scale:.6g}", f"zp={zero_point}"]
        for scale, zero_point, _, _ in built.per_tensor)
    assert sorted(row[2:6] for row in rows if row[2] != "per-tensor") == sorted(
        ["per-channel axis 0", f"{len(scales)} scales {min(scales):.6g}..{max(scales):.6g}",
         f"zp=0 (all {len(scales)})", "[-127, 127]"] for scales, *_ in built.per_channel)
    assert all(row[-1].startswith("quantize_per_tensor.out @") for row in rows
               if row[2] == "per-tensor")
    summary = inspect_text(capsys, built.portable)
    assert "quantization: 6 quantized tensors (per-tensor ×4, per-channel ×2; " \
           "see --show quantization)" in summary


@requires_executorch
@pytest.mark.oracle
def test_xnnpack_reports_the_graphs_parameters(capsys: pytest.CaptureFixture[str],
                                               built: Built) -> None:
    tensors = inspect_json(capsys, built.xnnpack)["quantization"]["tensors"]
    assert tensors and all(t["delegate"] == 0 and t["xnnpack_value"] is not None
                           for t in tensors)
    # The payload stores scales as float32.
    f32 = numpy.float32
    activations = [t for t in tensors if t["dtype"] == "qint8"]
    assert all(t["scheme"] == "per_tensor" for t in activations)
    assert {(f32(t["scale"]["values"][0]), t["zero_point"]["values"][0])
            for t in activations} == {(f32(s), z) for s, z, _, _ in built.per_tensor}
    weights = [t for t in tensors if t["dtype"] == "qcint8"]
    assert sorted(t["scale"]["values"] for t in weights) == \
        sorted([float(f32(s)) for s in scales] for scales, *_ in built.per_channel)
    assert all((t["scheme"], t["axis"], t["origin"]) == ("per_channel", 0, "constant")
               and t["zero_point"]["source"] == "implicit" for t in weights)
    assert {u["kind"] for t in weights for u in t["uses"]} == {"conv2d", "fully_connected"}
    biases = [t for t in tensors if t["dtype"] == "qcint32"]
    assert sorted(t["scale"]["count"] for t in biases) == [4, 5]
    text = inspect_text(capsys, built.xnnpack, "--show", "quantization")
    assert "  method forward, delegate[0] XnnpackBackend (" in text
    assert "constant -> conv2d #" in text and " filter\n" in text


@requires_executorch
@pytest.mark.oracle
def test_embedding_group_size(capsys: pytest.CaptureFixture[str], built: Built) -> None:
    four, byte = inspect_json(capsys, built.embeddings)["quantization"]["tensors"]
    s4, s8 = built.module.get_buffer("s4"), built.module.get_buffer("s8")
    assert (four["type"], four["dtype"], four["scheme"], four["group_size"]) == \
        ("u8[10, 16]", "i4", "per_group", 32 // 4)
    assert (four["scale"]["count"], four["scale"]["shape"]) == (40, [10, 4])
    assert (four["scale"]["min"], four["scale"]["max"]) == (s4.min().item(), s4.max().item())
    assert four["zero_point"]["source"] == "none"
    assert (four["quant_min"], four["quant_max"]) == (-8, 7)
    assert (byte["dtype"], byte["scheme"], byte["axis"], byte["group_size"]) == \
        ("i8", "per_channel", 0, None)
    assert byte["scale"]["values"] == s8.tolist()
    rows = cells(inspect_text(capsys, built.embeddings, "--show", "quantization"))
    assert rows[0][:3] == ["%0", "u8[10, 16] as i4", "per-group size 8"]
    assert rows[0][4:] == ["zp=none", "[-8, 7]", "constant -> embedding_4bit.out @0"]
    listing = inspect_text(capsys, built.embeddings, "--show", "instructions")
    assert f"{{per-group size 8: 40 scales {s4.min().item():.6g}..{s4.max().item():.6g}, " \
           "zp=none}" in listing


@requires_executorch
@pytest.mark.oracle
def test_float_model_reports_none(capsys: pytest.CaptureFixture[str], built: Built) -> None:
    info = inspect_json(capsys, built.float_model)
    assert info["quantization"] == {"count": 0, "tensors": []}
    assert "quantization:" not in render_summary(info, str)


def _flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0xFF
    return bytes(out)


@requires_executorch
@pytest.mark.oracle
def test_corrupted_quantized_files_still_inspect(capsys: pytest.CaptureFixture[str],
                                                 built: Built, tmp_path: Path) -> None:
    """Bytes flipped through the program (the calls and their constants) and
    the XNNPACK payload and its named scales: exit 0, or 3 with one line."""
    path = tmp_path / "corrupt.pte"
    reported = 0
    for source, step in ((built.portable, 23), (built.xnnpack, 29), (built.embeddings, 11)):
        data = source.read_bytes()
        for position in range(0, len(data), step):
            path.write_bytes(_flip(data, position))
            for args in (["--show", "quantization", "--show", "summary"], ["--json"]):
                code, out, err = run(capsys, "inspect", str(path), *args)
                assert code in (0, 3), (source.name, position, err)
                assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
                if code == 0 and args == ["--json"]:
                    reported += json.loads(out)["quantization"]["count"] > 0
    assert reported > 50


@requires_executorch
@pytest.mark.oracle
def test_method_narrows_and_describe_agrees(capsys: pytest.CaptureFixture[str],
                                            built: Built) -> None:
    info = inspect_json(capsys, built.portable, "--method", "forward")
    direct = describe(read_program_file(built.portable.read_bytes()))
    assert info["quantization"] == direct["quantization"]
