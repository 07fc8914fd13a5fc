"""The delegation framework, end to end, with a toy backend (no XNNPACK)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UsageError
from exirc.ir.meta import delegation_report
from exirc.runtime import load
from exirc.runtime.delegates.registry import BACKENDS, BackendRegistry
from exirc.serialize import deserialize
from tests.backend.delegation.toy_backend import BACKEND_ID, ToyRuntime

PARTITIONER = "tests.backend.delegation.toy_backend:ToyPartitioner"


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.relu(x * self.w + y)
        b = a.sum(0, keepdim=True)       # the toy backend has no sum: a second partition
        return b * a + 1.0, a


def toy_pipeline(tmp_path: Path, partitioner: str = PARTITIONER) -> Path:
    text = Path("exirc/targets/portable.yaml").read_text().replace(
        "  backend:\n",
        f"  backend:\n    - delegate:\n        partitioner: {partitioner}\n"
        "    - dead_code_elimination\n")
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return path


def toy_backends() -> BackendRegistry:
    registry = BackendRegistry(BACKENDS)
    registry.register(BACKEND_ID, ToyRuntime())
    return registry


def compile_toy(tmp_path: Path, **options: object):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Model()
    inputs = (torch.randn(3, 4), torch.randn(3, 4))
    result = compile_module(model, inputs, options=CompileOptions(
        pipeline=toy_pipeline(tmp_path), **options))  # type: ignore[arg-type]
    return model, inputs, result


def test_delegated_program_runs_equal_to_eager(tmp_path: Path) -> None:
    model, inputs, result = compile_toy(tmp_path)
    outputs = load(result.data, backends=toy_backends()).run("forward", list(inputs))
    for got, want in zip(outputs, model(*inputs)):
        torch.testing.assert_close(got, want)


def test_file_has_two_delegate_calls_and_stores_the_weight_once(tmp_path: Path) -> None:
    _, _, result = compile_toy(tmp_path)
    program = deserialize(result.data)
    plan = program.execution_plan[0]
    assert [d.id for d in plan.delegates] == [BACKEND_ID, BACKEND_ID]
    assert [type(i).__name__ for i in plan.chains[0].instructions].count("DelegateCall") == 2
    weight = Model().w  # same shape; the stored bytes are the seeded model's
    sizes = [len(program.segments[n.segment_index].data) for n in program.named_data
             if len(n.key) == 64]
    assert weight.nbytes in sizes
    # The weight is in the payload's named data, not also a program constant.
    assert all(len(bytes(b.storage)) != weight.nbytes for b in program.constant_buffer)
    assert plan.delegates[0].compile_specs[0].key == "toy"


def test_report_lists_partitions_and_left_out_nodes_with_reasons(tmp_path: Path) -> None:
    _, _, result = compile_toy(tmp_path)
    # The report is read off the graph after the backend stage.
    report = delegation_report(result.planned["forward"].graph_module)
    assert report is not None
    assert [p.ops for p in report.partitions] == [{"mul.Tensor": 1, "add.Tensor": 1,
                                                   "relu": 1},
                                                  {"mul.Tensor": 1, "add.Tensor": 1}]
    (left,) = report.left_out
    assert left.op == "sum.dim_IntList" and left.category == "op"
    assert "add, mul and relu only" in left.reason
    assert left.source is not None and "test_delegation.py" in left.source
    assert report.to_json()["delegated_nodes"] == 5


def test_delegate_call_is_visible_in_printed_ir(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    compile_toy(tmp_path, print_ir_after_all=True)
    printed = capsys.readouterr()
    assert "ToyBackend_0" in printed.out + printed.err


def test_lowered_program_still_runs_eagerly_for_verify(tmp_path: Path) -> None:
    BACKENDS.register(BACKEND_ID, ToyRuntime())  # --verify runs the default registry
    _, _, result = compile_toy(tmp_path, verify=True)
    assert result.verification is not None


def test_unknown_partitioner_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError,
                       match="partitioner no_such_module:P: cannot import no_such_module"):
        compile_module(Model(), (torch.randn(3, 4), torch.randn(3, 4)), options=CompileOptions(
            pipeline=toy_pipeline(tmp_path, "no_such_module:P")))


def test_cli_explains_delegation_as_text_and_json(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from exirc.cli.app import cli as main

    model = tmp_path / "toy_model.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = torch.relu(x * x + x)\n"
        "        return y.sum(0, keepdim=True) + y.sum(1, keepdim=True) + y\n"
        "model = M()\n"
        "example_inputs = (torch.randn(3, 4),)\n"
        "methods = {'again': (model, (torch.randn(2, 4),))}\n")
    pipeline = toy_pipeline(tmp_path)
    runner = CliRunner()
    text = runner.invoke(main, ["compile", str(model), "--pipeline", str(pipeline),
                                "-o", str(tmp_path / "t.pte"), "--explain-delegation"])
    assert text.exit_code == 0, text.output
    # One line per (reason, op), with its count; the two methods (one graph,
    # exported at two shapes) once.
    assert text.stdout == (
        "method forward, again: 5 of 7 nodes delegated in 2 partitions (ToyBackend), "
        "partitioner tests.backend.delegation.toy_backend:ToyPartitioner\n"
        "  delegated (weights 0 B): add.Tensor ×3, mul.Tensor, relu\n"
        "  left on the interpreter (2 nodes, 1 reason):\n"
        "    sum.dim_IntList ×2 [op] the toy backend runs add, mul and relu only  "
        "at toy_model.py:5\n"
        "(--explain-delegation=full lists every partition and every node)\n")
    assert "delegated 10 of 14 nodes in 4 partitions" in text.stderr
    full = runner.invoke(main, ["compile", str(model), "--pipeline", str(pipeline), "-q",
                                "-o", str(tmp_path / "t.pte"), "--explain-delegation=full"])
    assert full.exit_code == 0, full.output
    listing = full.stdout.splitlines()
    assert listing.count("  left on the interpreter (2):") == 2  # per method, per node
    assert [line for line in listing if "%sum" in line][0].startswith(
        "    %sum_1 sum.dim_IntList [op] the toy backend runs add, mul and relu only  at ")
    assert str(model) + ":5:" in full.stdout  # the full path and the code
    as_json = runner.invoke(main, ["compile", str(model), "--pipeline", str(pipeline), "-q",
                                   "-o", str(tmp_path / "t.pte"), "--explain-delegation=json"])
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    method = document["methods"]["forward"]
    assert method["delegated_nodes"] == 5 and len(method["partitions"]) == 2
    assert method["left_out"][0]["category"] == "op"


def test_methods_whose_delegation_differs_are_shown_each() -> None:
    from exirc.backend.delegation.report import DelegationReport, LeftOut
    from exirc.cli.delegation_text import explain_text

    def report(*left_out: LeftOut) -> DelegationReport:
        made = DelegationReport("xnnpack", compute_nodes=len(left_out))
        made.left_out.extend(left_out)
        return made

    guard = LeftOut("where", "where.self", "op", "XNNPACK has no operator for aten.where.self",
                    "/site-packages/transformers/modeling_llama.py:258: out = attention(")
    text = explain_text({"forward": report(guard, guard), "prefill": report(guard, guard),
                         "decode": report(guard)})
    assert text.splitlines() == [
        "method forward, prefill: 0 of 2 nodes delegated in 0 partitions, partitioner xnnpack",
        "  left on the interpreter (2 nodes, 1 reason):",
        "    where.self ×2 [op] XNNPACK has no operator for aten.where.self  "
        "at modeling_llama.py:258",
        "method decode: 0 of 1 nodes delegated in 0 partitions, partitioner xnnpack",
        "  left on the interpreter (1 node, 1 reason):",
        "    where.self [op] XNNPACK has no operator for aten.where.self  "
        "at modeling_llama.py:258",
        "(--explain-delegation=full lists every partition and every node)"]
