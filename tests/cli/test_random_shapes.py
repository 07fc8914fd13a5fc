"""`exirc run --random` on dynamic dims: `--shape NAME=2x17`, or sizes picked in range."""

from __future__ import annotations

import io
import os
import subprocess
import textwrap
from pathlib import Path

import numpy
import pytest
import torch

from exirc.cli.random_shapes import DEFAULT_DIM_CAP, parse_shape_options, random_shapes
from exirc.errors import InputError, UsageError
from exirc.runtime.core.inputs import InputSpec
from exirc.serialize.symbolic_shapes import MethodShapes, SymbolRange
from tests import warm_exirc

# y's size is twice x's first: a relation --random must keep.
RELATED = """\
import torch


class Related(torch.nn.Module):
    def forward(self, x, y):
        return x.sum(1).repeat(2) + y


n = torch.export.Dim("n", min=2, max=100000)
model = Related().eval()
example_inputs = (torch.randn(3, 4), torch.randn(6))
dynamic_shapes = ({0: n}, {0: 2 * n})
"""


def exirc(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return warm_exirc.exirc(args, timeout=120, cwd=cwd, env={**os.environ, "NO_COLOR": "1"})


@pytest.fixture(scope="module")
def related(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("related")
    (directory / "related.py").write_text(textwrap.dedent(RELATED))
    compiled = exirc("compile", "related.py", "-o", "related.pte", "-q", cwd=directory)
    assert compiled.returncode == 0, compiled.stderr.decode()
    return directory


def output_shape(ran: subprocess.CompletedProcess[bytes]) -> tuple[int, ...]:
    assert ran.returncode == 0, ran.stderr.decode()
    return tuple(numpy.load(io.BytesIO(ran.stdout))["output_0"].shape)


def test_random_picks_related_sizes_up_to_the_cap(related: Path) -> None:
    # n <= 100000: --random takes the cap, and y follows as 2*n.
    ran = exirc("run", "related.pte", "--random", "-o", "-", cwd=related)
    assert output_shape(ran) == (2 * DEFAULT_DIM_CAP,)


@pytest.mark.parametrize(("shape", "expected"), [
    (["input_0=5x4"], (10,)), (["x=5x4"], (10,)), (["0=5x4"], (10,)), (["1=14"], (14,)),
    (["input_0=3x4", "input_1=6"], (6,)),
])
def test_shape_by_name_or_index_and_the_rest_follows(related: Path, shape: list[str],
                                                     expected: tuple[int, ...]) -> None:
    flags = [arg for option in shape for arg in ("--shape", option)]
    ran = exirc("run", "related.pte", "--random", *flags, "-o", "-", cwd=related)
    assert output_shape(ran) == expected


@pytest.mark.parametrize(("shape", "message"), [
    (["input_0=100001x4"], "--shape x=100001x4: x dim 0 is 100001, but n must be "
                           "in 2..100000"),
    (["input_0=3x5"], "--shape x=3x5: x dim 1 is 5, but must be 4"),
    (["input_1=11"], "y dim 0 is 11, but must be 2*n for some n in 2..100000"),
    (["input_0=3x4", "input_1=8"], "y dim 0 is 8, but must be 2*n = 6"),
    (["input_0=3"], "--shape input_0=3: x has 2 dims (f32[n<=100000, 4]), not 1"),
])
def test_a_bad_shape_names_the_input_and_its_allowed_range(related: Path, shape: list[str],
                                                          message: str) -> None:
    flags = [arg for option in shape for arg in ("--shape", option)]
    ran = exirc("run", "related.pte", "--random", *flags, cwd=related)
    err = ran.stderr.decode()
    assert ran.returncode == 2
    assert err.startswith("error[E0201]: ")
    assert message in err
    assert "x: f32[n<=100000, 4], y: f32[2*n<=200000]" in err or \
        "has 2 dims" in message  # the whole signature, or the input's own


@pytest.mark.parametrize(("args", "message"), [
    (["--random", "--shape", "z=3x4"], "--shape z: method 'forward' has no input 'z'; its "
                                       "inputs are x: f32[n<=100000, 4]"),
    (["--random", "--shape", "0=3*4"], "--shape '0=3*4' is not NAME=SIZES"),
    (["--shape", "0=3x4"], "--shape only applies to --random"),
])
def test_shape_usage_errors(related: Path, args: list[str], message: str) -> None:
    ran = exirc("run", "related.pte", *args, cwd=related)
    assert ran.returncode == 2
    assert ran.stderr.decode().startswith(f"error[E0200]: {message}")


# -- the choice itself, on hand-made signatures ------------------------------------


def spec(name: str, shape: tuple[int, ...], dims: tuple[int | str, ...] | None,
         dynamic: bool = True) -> InputSpec:
    return InputSpec(name, 0, "tensor", torch.float32, shape, dynamic,
                     symbol_dims=dims, symbolic=tuple(map(str, dims)) if dims else None)


def test_a_symbol_without_upper_bound_takes_its_lower_bound() -> None:
    shapes = MethodShapes({"s0": SymbolRange(3, None), "s1": SymbolRange(2, 10)})
    specs = [spec("input_0", (1 << 20, 10), ("s0", "s1"))]
    assert random_shapes("forward", specs, shapes, {}) == [(3, 10)]


def test_a_lower_bound_above_the_cap_wins() -> None:
    shapes = MethodShapes({"s0": SymbolRange(DEFAULT_DIM_CAP + 5, 10 * DEFAULT_DIM_CAP)})
    specs = [spec("input_0", (10 * DEFAULT_DIM_CAP,), ("s0",))]
    assert random_shapes("forward", specs, shapes, {}) == [(DEFAULT_DIM_CAP + 5,)]


def test_without_symbolic_shapes_upper_bounds_are_used_and_checked() -> None:
    specs = [spec("input_0", (8, 3), None), spec("input_1", (2,), None, dynamic=False)]
    assert random_shapes("forward", specs, None, {}) == [(8, 3), (2,)]
    assert random_shapes("forward", specs, None, {"0": (5, 3)}) == [(5, 3), (2,)]
    with pytest.raises(InputError, match=r"input_0 dim 0 is 9, but must be at most 8"):
        random_shapes("forward", specs, None, {"input_0": (9, 3)})
    with pytest.raises(InputError, match=r"input_1 dim 0 is 1, but must be 2 "):
        random_shapes("forward", specs, None, {"input_1": (1,)})


def test_parse_shape_options() -> None:
    assert parse_shape_options(["x=2x17", "1=3", "s="]) == {"x": (2, 17), "1": (3,), "s": ()}
    for bad in ("x", "=3", "x=2,3", "x=-1", "x=2x"):
        with pytest.raises(UsageError, match="is not NAME=SIZES"):
            parse_shape_options([bad])
    with pytest.raises(UsageError, match="gives 'x' twice"):
        parse_shape_options(["x=1", "x=2"])
