"""Inputs are checked against every relation between their dims before anything runs.

A symbol shared by several dims (of one input or of several) must have one
value; a derived dim (`2*s0`, `s0 + 1`) must equal its expression; every
symbol must be in its range; a static dim of a dynamic tensor must be exact.
A broken relation is an `InputError` (exit 2) naming each input, dim and size
and where the symbol got its value, raised before the first instruction.
"""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import torch
from torch.export import Dim

from exirc.compiler import compile_module
from exirc.errors import InputError
from exirc.runtime import load
from exirc.serialize.symbolic_shapes import InputDims, SymbolRange, check_dims
from tests import warm_exirc


class MatMulT(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b.T


class Pairs(torch.nn.Module):
    """a has twice b's rows; b has one column more than rows."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.reshape(-1, 2, 4).sum(1) + b.sum(1, keepdim=True)


class Halves(torch.nn.Module):
    """Only a derived dim: the symbol is solved for from `2*s0`."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a.reshape(-1, 2, 4).sum(1)


N = Dim("n", min=1, max=16)

MODELS = {
    "square": (MatMulT, (torch.randn(4, 4), torch.randn(4, 4)), ({0: N, 1: N}, {0: N, 1: N})),
    "rows": (MatMulT, (torch.randn(4, 4), torch.randn(4, 4)), ({0: N}, {0: N})),
    "pairs": (Pairs, (torch.randn(8, 4), torch.randn(4, 5)), ({0: 2 * N}, {0: N, 1: N + 1})),
    "halves": (Halves, (torch.randn(8, 4),), ({0: 2 * N},)),
}

BY_0 = "(bound by a dim 0)"

# model, input shapes, what the error says (every part of it)
REFUSED = [
    ("square", [(3, 3), (5, 5)], [f"b dim 0 is 5, but must be n = 3 {BY_0}",
                                  f"b dim 1 is 5, but must be n = 3 {BY_0}"]),
    ("square", [(3, 4), (3, 3)], [f"a dim 1 is 4, but must be n = 3 {BY_0}"]),
    ("square", [(3, 3), (3, 2)], [f"b dim 1 is 2, but must be n = 3 {BY_0}"]),
    ("rows", [(3, 4), (5, 4)], [f"b dim 0 is 5, but must be n = 3 {BY_0}"]),
    ("rows", [(3, 4), (3, 2)], ["b dim 1 is 2, but must be 4"]),
    ("rows", [(3, 4), (20, 4)], [f"b dim 0 is 20, but must be n = 3 {BY_0}"]),
    # the range is checked where the symbol is bound, with that input's size
    ("rows", [(20, 4), (3, 4)], ["a dim 0 is 20, but n must be in 1..16",
                                 f"b dim 0 is 3, but must be n = 20 {BY_0}"]),
    ("rows", [(17, 4), (17, 4)], ["a dim 0 is 17, but n must be in 1..16"]),
    ("pairs", [(10, 4), (4, 5)], ["a dim 0 is 10, but must be 2*n = 8 "
                                  "(n = 4, bound by b dim 0)"]),
    ("pairs", [(8, 4), (4, 6)], ["b dim 1 is 6, but must be n + 1 = 5 "
                                 "(n = 4, bound by b dim 0)"]),
    ("pairs", [(34, 4), (17, 18)], ["b dim 0 is 17, but n must be in 1..16"]),
    ("halves", [(7, 4)], ["a dim 0 is 7, but must be 2*n for some n in"]),
    ("halves", [(34, 4)], ["a dim 0 is 34, but must be 2*n for some n in"]),
]

ACCEPTED = [("square", [(3, 3), (3, 3)]), ("rows", [(3, 4), (3, 4)]), ("rows", [(16, 4), (16, 4)]),
            ("pairs", [(6, 4), (3, 4)]), ("halves", [(6, 4)])]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("relations")
    paths = {}
    for name, (model, example, dynamic_shapes) in MODELS.items():
        paths[name] = folder / f"{name}.pte"
        compile_module(model().eval(), example, dynamic_shapes=dynamic_shapes).save(paths[name])
    return paths


def arrays(shapes: list[tuple[int, int]]) -> list[numpy.ndarray]:
    generator = numpy.random.default_rng(0)
    return [generator.standard_normal(shape).astype(numpy.float32) for shape in shapes]


@pytest.mark.parametrize(("name", "shapes", "parts"), REFUSED)
def test_python_api_refuses_before_the_first_instruction(
        programs: dict[str, Path], name: str, shapes: list[tuple[int, int]],
        parts: list[str]) -> None:
    method = load(programs[name]).method("forward")
    ran: list[tuple[int, int]] = []
    with pytest.raises(InputError) as caught:
        method.run(arrays(shapes), observer=lambda chain, index: ran.append((chain, index)))
    assert ran == []
    error = caught.value
    assert error.code == "E0201" and error.exit_code == 2
    for part in parts:
        assert part in error.message, error.message
    assert error.message.count("; ") == len(parts) - 1, error.message  # nothing else
    assert "method 'forward'" in error.message and error.hint


COMMAND_LINE_CASES = [case for case in REFUSED if case[0] in ("rows", "pairs")]


@pytest.mark.parametrize(("name", "shapes", "parts"), COMMAND_LINE_CASES)
def test_command_line_refuses_with_exit_code_2(
        programs: dict[str, Path], name: str, shapes: list[tuple[int, int]], parts: list[str],
        tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.npz"
    numpy.savez(inputs, **{f"input_{i}": a for i, a in enumerate(arrays(shapes))})
    out = tmp_path / "out.npz"
    result = warm_exirc.exirc(["run", str(programs[name]), "--inputs", str(inputs),
                               "-o", str(out)], text=True, timeout=120)
    code, stderr = result.returncode, result.stderr
    assert code == 2, stderr
    assert stderr.startswith("error[E0201]: "), stderr
    for part in parts:
        assert part in stderr, stderr
    assert "hint: " in stderr and "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.parametrize(("name", "shapes"), ACCEPTED)
def test_related_sizes_run_and_match_eager(programs: dict[str, Path], name: str,
                                           shapes: list[tuple[int, int]]) -> None:
    inputs = arrays(shapes)
    (got,) = load(programs[name]).run("forward", inputs)
    with torch.no_grad():
        want = MODELS[name][0]()(*[torch.from_numpy(a) for a in inputs])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_check_dims_names_where_each_symbol_was_bound() -> None:
    symbols = {"s0": SymbolRange(1, 16), "s1": SymbolRange(2, 8)}
    inputs = [InputDims("input_0", ("s0", "s1 + 1"), (4, 6)),
              InputDims("input_1", ("2*s1", "s0*s1"), (10, 20)),
              InputDims("input_2", (3, "s0"), (3, 4))]
    bound, problems = check_dims(symbols, inputs)
    assert {s: (b.value, b.source) for s, b in bound.items()} == {
        "s0": (4, "input_0 dim 0"), "s1": (5, "input_0 dim 1")}
    assert problems == []  # 2*5 == 10, 4*5 == 20, 3 == 3, 4 == 4

    _, problems = check_dims(symbols, [InputDims("input_0", ("s0", "s1 + 1"), (4, 6)),
                                       InputDims("input_1", ("2*s1", 7), (12, 8))])
    assert [(p.message, p.kind) for p in problems] == [
        ("input_1 dim 0 is 12, but must be 2*s1 = 10 "
         "(s1 = 5, bound by input_0 dim 1 = s1 + 1)", "relation"),
        ("input_1 dim 1 is 8, but must be 7", "static")]


def test_check_dims_solves_for_a_symbol_only_in_its_range() -> None:
    symbols = {"s0": SymbolRange(2, 8)}
    _, problems = check_dims(symbols, [InputDims("input_0", ("2*s0 + 1",), (9,))])
    assert problems == []
    _, problems = check_dims(symbols, [InputDims("input_0", ("2*s0 + 1",), (19,))])
    assert [p.message for p in problems] == [
        "input_0 dim 0 is 19, but must be 2*s0 + 1 for some s0 in 2..8"]
    # unbounded symbols are solved too
    bound, problems = check_dims({"s0": SymbolRange(1, None)},
                                 [InputDims("input_0", ("4*s0",), (4000,))])
    assert bound["s0"].value == 1000 and problems == []
