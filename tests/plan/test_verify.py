"""The plan stage's verifier, and lifetimes that follow backend ops to their memory.

A fused backend op (`exirc::addmm_relu`) writes into its `out=` alloc like
any out-variant; its result's uses must keep that alloc live, or the planner
reuses the bytes while they are still read (the `slice -> linear -> relu ->
linear` head that `--target exirc` got wrong). And whatever runs after
`memory_plan`, the plan the emitter writes must be sound: the compile fails,
and writes nothing, when it is not.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
import yaml
from torch.fx import Graph, Node

from exirc.backend.ops import addmm_relu
from exirc.cli.app import main
from exirc.compiler import CompileOptions, compile_module
from exirc.errors import InternalError
from exirc.ir.meta import planned_memory, set_memory_plan, set_planned_memory
from exirc.pipelines import load_pipeline
from exirc.plan.lifetimes import tensor_lifetimes
from exirc.plan.ops import alloc
from exirc.plan.verify import verify_memory_plan
from tests.plugin_modules import plugin_module
from tests.targets import TARGETS

aten = torch.ops.aten


def _tensor_node(node: Node, shape: Sequence[int]) -> Node:
    node.meta["val"] = torch.empty(tuple(shape), device="meta")
    return node


def _alloc(graph: Graph, shape: Sequence[int]) -> Node:
    return _tensor_node(graph.call_function(alloc, ((tuple(shape), torch.float32),)), shape)


# --------------------------------------------------------------------------
# Lifetimes of backend ops.
# --------------------------------------------------------------------------


@pytest.mark.smoke
def test_a_backend_ops_result_keeps_its_out_alloc_live() -> None:
    g = Graph()
    x = _tensor_node(g.placeholder("x"), [2, 8])  # 0
    bias, weight = g.placeholder("b"), g.placeholder("w")  # 1, 2: parameters
    hidden = _alloc(g, [2, 16])  # 3
    fused = _tensor_node(  # 4
        g.call_function(addmm_relu, (bias, x, weight), {"out": hidden}), [2, 16])
    out = _alloc(g, [2, 4])  # 5
    last = _tensor_node(  # 6: reads the fused result, so its alloc is live here
        g.call_function(aten.addmm.out, (bias, fused, weight), {"out": out}), [2, 4])
    g.output((last,))  # 7

    spans = {lt.node.name: (lt.start, lt.end) for lt in tensor_lifetimes(g, {"x"})}

    assert spans == {"x": (0, 4), "alloc": (3, 6), "alloc_1": (5, 7)}


def test_a_tensor_result_aliasing_nothing_planned_is_an_internal_error() -> None:
    def opaque(t: torch.Tensor) -> torch.Tensor:  # no schema: its memory is unknowable
        return t

    g = Graph()
    x = _tensor_node(g.placeholder("x"), [4])
    mystery = _tensor_node(g.call_function(opaque, (x,)), [4])
    out = _alloc(g, [4])
    g.output((g.call_function(aten.neg.out, (mystery,), {"out": out}),))

    with pytest.raises(InternalError, match=r"cannot tell which planned memory %opaque"):
        tensor_lifetimes(g, {"x"})


# --------------------------------------------------------------------------
# The verifier on the final plan.
# --------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _planned(target: str) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    result = compile_module(MLP().eval(), (torch.randn(2, 8),),
                            options=CompileOptions(target=target))
    return result.planned["forward"]


def _live_pair(program: torch.export.ExportedProgram) -> tuple[Node, Node]:
    """Two planned tensors live at the same time (at different offsets)."""
    graph = program.graph_module.graph
    inputs = {n.name for n in graph.nodes
              if n.op == "placeholder" and planned_memory(n) is not None}
    lifetimes = tensor_lifetimes(graph, inputs)
    for i, a in enumerate(lifetimes):
        for b in lifetimes[i + 1:]:
            if a.overlaps(b):
                return a.node, b.node
    raise AssertionError("no two planned tensors live at the same time")


@pytest.mark.parametrize("target", TARGETS)
def test_the_compiled_plan_passes_the_verifier(target: str) -> None:
    verify_memory_plan(_planned(target))


def test_a_moved_tensor_is_named_with_both_lifetimes_and_byte_ranges() -> None:
    program = _planned("portable")
    a, b = _live_pair(program)
    small, big = sorted((a, b), key=lambda n: n.meta["val"].numel())  # it fits the arena
    set_planned_memory(small, *_memory(big))

    with pytest.raises(InternalError) as caught:
        verify_memory_plan(program)

    message = str(caught.value)
    pattern = (rf"unsound memory plan: %{a.name} \(lifetime \[\d+, \d+\], bytes \[\d+, \d+\)\) "
               rf"and %{b.name} \(lifetime \[\d+, \d+\], bytes \[\d+, \d+\)\) are live at the "
               "same time and share bytes")
    assert re.fullmatch(pattern, message), message
    assert caught.value.hint is not None and "after memory_plan" in caught.value.hint


def test_a_program_with_no_plan_has_nothing_to_verify() -> None:
    program = _planned("portable")
    set_memory_plan(program.graph_module, None)
    verify_memory_plan(program)


# A pass a user's pipeline runs after memory_plan, breaking the plan: it moves
# one tensor onto the bytes of another that is live at the same time.
COLLIDE = '''
from exirc.passes.contract import PassResult
from exirc.plan.lifetimes import tensor_lifetimes
from exirc.ir.meta import planned_memory, set_planned_memory
from exirc.plan.ops import alias_view

MOVED = []


def collide(program):
    graph = program.graph_module.graph
    inputs = {n.name for n in graph.nodes
              if n.op == "placeholder" and planned_memory(n) is not None}
    lifetimes = tensor_lifetimes(graph, inputs, view_ops={alias_view})
    for i, a in enumerate(lifetimes):
        for b in lifetimes[i + 1:]:
            if a.overlaps(b):
                small, big = sorted((a, b), key=lambda lt: lt.nbytes)  # it fits the arena
                set_planned_memory(small.node, *planned_memory(big.node))
                MOVED.append((a.node.name, b.node.name))
                return PassResult(program, True)
    return PassResult(program, False)
'''

MODEL = """\
import torch

torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


model = MLP().eval()
example_inputs = (torch.randn(2, 8),)
"""


@pytest.fixture
def collide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from plugin_module(tmp_path, monkeypatch, COLLIDE, "exirc_test_collide")


@pytest.mark.parametrize("target", TARGETS)
def test_a_pass_after_memory_plan_that_breaks_the_plan_fails_the_compile(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, collide: str, target: str) -> None:
    pipeline = yaml.safe_load(load_pipeline(target).describe())
    pipeline["stages"]["plan"].append(f"{collide}:collide")
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL))
    pte = tmp_path / "model.pte"

    code = main(["compile", str(tmp_path / "model.py"), "-o", str(pte),
                 "--pipeline", str(tmp_path / "pipeline.yaml")])
    err = capsys.readouterr().err

    assert code == 1, err  # an InternalError
    ((a, b),) = sys.modules[collide].MOVED
    first = err.splitlines()[0]
    assert first.startswith("error[E0100]: unsound memory plan: "), err
    for name in (a, b):
        assert re.search(rf"%{name} \(lifetime \[\d+, \d+\], bytes \[\d+, \d+\)\)", first), err
    assert "Traceback" not in err
    assert not pte.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.pte.")]


def _memory(node: torch.fx.Node) -> tuple[int, int]:
    memory = planned_memory(node)
    assert memory is not None
    return memory
