"""cond, map and while_loop compiled to jump ranges and loops, checked against
eager PyTorch through `exirc run` and ExecuTorch's runtime.

ExecuTorch cannot compile `while_loop`, but runs the programs we emit for it:
they use only portable kernels, so those run there too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch._higher_order_ops.map import map as map_rows
from torch._higher_order_ops.while_loop import while_loop

from exirc.cli.app import main
from exirc.serialize import program as P
from tests.control_flow.helpers import Inputs, check_everywhere, compiled


class CondTwoOutputs(torch.nn.Module):
    """Branches compute different things, one reads parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def grow(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.linear(x).relu(), x.sum(0, keepdim=True) * 2

        def shrink(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.cos() - 1, x.amax(0, keepdim=True)

        y, z = torch.cond(x.mean() > 0, grow, shrink, (x,))
        return y + 1, z


class NestedCond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.5, -2.0, 0.5]))

    def forward(self, x: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        def outer_true(x: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
            return torch.cond(flag.sum() > 0, lambda x: x * self.scale, lambda x: x + 10, (x,))

        def outer_false(x: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
            return x.neg()

        return torch.cond(x.sum() > 0, outer_true, outer_false, (x, flag))


class MapRows(torch.nn.Module):
    """map over a batch, the body reading parameters and an extra operand."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 5)

    def forward(self, xs: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return map_rows(lambda row, b: self.linear(row).tanh() + b, xs, bias)


class CondInMap(torch.nn.Module):
    """A cond inside a loop body: each row takes its own branch."""

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        def body(row: torch.Tensor) -> torch.Tensor:
            return torch.cond(row.sum() > 0, lambda r: r * 3, lambda r: r.abs() + 0.5, (row,))

        return map_rows(body, xs)


class WhileCountdown(torch.nn.Module):
    """A data-dependent trip count: the loop runs `n` times."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def keep_going(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return i < n

        def step(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, self.linear(y).tanh()

        return while_loop(keep_going, step, (torch.zeros((), dtype=torch.int64), x))


class WhileWithCond(torch.nn.Module):
    """Double until the sum passes a limit; a cond in the body; states swap."""

    def forward(self, x: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def below(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a.abs().sum() < limit

        def step(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            grown = torch.cond(a.sum() > 0, lambda t: t * 2, lambda t: t * 3, (a,))
            # The old `a` becomes `b`: the loop must not read `a` after
            # overwriting it (torch wants the clone; returning `a` aliases).
            return grown + 0.25, a.clone()

        return while_loop(below, step, (x, x.clone()))


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], Inputs],
                        list[Callable[[], Inputs]]]] = {
    "cond_two_outputs": (CondTwoOutputs, lambda: (torch.randn(3, 4),), [
        lambda: (torch.rand(3, 4) + 0.1,), lambda: (-torch.rand(3, 4) - 0.1,)]),
    "nested_cond": (NestedCond, lambda: (torch.randn(3), torch.randn(2)), [
        lambda: (torch.ones(3), torch.ones(2)), lambda: (torch.ones(3), -torch.ones(2)),
        lambda: (-torch.ones(3), torch.ones(2))]),
    "map_rows": (MapRows, lambda: (torch.randn(6, 3), torch.randn(5)), [
        lambda: (torch.randn(6, 3), torch.randn(5)), lambda: (torch.zeros(6, 3), torch.ones(5))]),
    "cond_in_map": (CondInMap, lambda: (torch.randn(5, 3),), [
        lambda: (torch.tensor([[1.0, 2, 3], [-1, -2, -3], [0.5, -0.1, 0], [-4, 1, 1],
                               [2, 2, -5]]),)]),
    "while_countdown": (WhileCountdown, lambda: (torch.randn(2, 4), torch.tensor(3)), [
        lambda: (torch.randn(2, 4), torch.tensor(0)), lambda: (torch.randn(2, 4), torch.tensor(1)),
        lambda: (torch.randn(2, 4), torch.tensor(7))]),
    "while_with_cond": (WhileWithCond, lambda: (torch.randn(4), torch.tensor(50.0)), [
        lambda: (torch.tensor([0.5, 1.0, -0.25, 2.0]), torch.tensor(100.0)),
        lambda: (torch.tensor([-1.0, -0.5, -2.0, 0.1]), torch.tensor(40.0)),
        lambda: (torch.tensor([9.0, 9.0, 9.0, 9.0]), torch.tensor(1.0))]),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_matches_eager_through_exirc_run_and_executorch(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build, example, cases = MODELS[name]
    model, result = compiled(name, build, example)
    torch.manual_seed(1)
    check_everywhere(model, result, [case() for case in cases], tmp_path, capsys)


def _jumps(name: str) -> list[tuple[int, P.JumpFalseCall]]:
    build, example, _ = MODELS[name]
    _, result = compiled(name, build, example)
    instructions = result.program.execution_plan[0].chains[0].instructions
    return [(i, instr) for i, instr in enumerate(instructions)
            if isinstance(instr, P.JumpFalseCall)]


def test_cond_is_two_ranges_chosen_by_jump_false() -> None:
    (first, to_else), (second, to_end) = _jumps("cond_two_outputs")
    assert first < to_else.destination_instruction == second + 1  # else starts after the goto
    assert to_end.destination_instruction > second  # the goto skips the else range


def test_loops_jump_backwards() -> None:
    for name in ("map_rows", "while_countdown"):
        backward = [(i, j) for i, j in _jumps(name) if j.destination_instruction <= i]
        assert len(backward) == 1, name


def test_constant_work_leaves_loop_bodies() -> None:
    # The Linear in WhileCountdown's body transposes its weight; that is done
    # once at compile time, and the untransposed weight is not stored.
    _, result = compiled("while_countdown", *MODELS["while_countdown"][:2])
    plan = result.program.execution_plan[0]
    assert "aten::permute_copy.out" not in {op.qualified_name for op in plan.operators}
    weights = [v for v in plan.values if isinstance(v, P.Tensor) and v.data_buffer_idx
               and v.sizes == [4, 4]]
    assert len(weights) == 1


def test_while_loop_state_is_not_aliased_when_results_swap() -> None:
    # WhileWithCond returns the old state `a` as the new `b`: reading `a`
    # after it is overwritten would give b == a.
    model = WhileWithCond()
    x, limit = torch.tensor([0.5, 1.0, -0.25, 2.0]), torch.tensor(100.0)
    _, result = compiled("while_with_cond", *MODELS["while_with_cond"][:2])
    from exirc.runtime import load

    a, b = load(result.data).run("forward", [x, limit])
    expected_a, expected_b = model(x, limit)
    assert not torch.equal(a, b)
    torch.testing.assert_close(b, expected_b)


def test_loop_body_returning_its_state_gets_copies() -> None:
    from exirc.plan.to_out_variants import copy_passthrough_results

    class Swap(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return b, a, a

    body = torch.fx.symbolic_trace(Swap())
    for node in body.graph.nodes:
        node.meta["val"] = torch.empty(2)
    copy_passthrough_results(body)
    results = body.graph.output_node().args[0]
    assert all(r.target is torch.ops.aten.clone.default for r in results)
    assert len(set(results)) == 3
    a, b = torch.ones(2), torch.zeros(2)
    assert [t.tolist() for t in body(a, b)] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_loop_body_returning_a_view_of_its_state_gets_a_copy() -> None:
    from exirc.plan.ops import alias_view
    from exirc.plan.to_out_variants import copy_passthrough_results

    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    view = graph.call_function(alias_view, (a, [2]))
    graph.output((b, view))
    body = torch.fx.GraphModule(torch.nn.Module(), graph)
    for node in body.graph.nodes:
        node.meta["val"] = torch.empty(2)
    copy_passthrough_results(body)
    results = body.graph.output_node().args[0]
    assert [r.target for r in results] == [torch.ops.aten.clone.default] * 2
    assert results[1].args[0] is view


def test_listing_shows_branches_and_loops(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.pte"
    compiled("cond_in_map", *MODELS["cond_in_map"][:2])[1].save(path)
    assert main(["inspect", str(path), "--show", "instructions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    labels = [line.strip() for line in lines if line.strip() in ("loop:", "else:")]
    assert labels == ["loop:", "else:"]
    loop_at = next(i for i, line in enumerate(lines) if line.strip() == "loop:")
    body = lines[loop_at + 1]
    assert body.split()[1] != "" and body.index(body.split()[1]) > \
        lines[loop_at - 1].index(lines[loop_at - 1].split()[1])  # the body is indented
    assert any("if not %" in line and "goto" in line for line in lines)
    assert any("executorch_prim::et_copy_index.tensor(%" in line for line in lines)
