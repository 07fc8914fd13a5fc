"""`exirc compile --max-arena SIZE`: sizes, the limit check, its error, and no file on failure."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UsageError
from exirc.ir.meta import set_memory_plan
from exirc.plan.limits import ArenaLimitError, check_arena_limit, format_size
from tests.compile.test_cli_compile import MLP, listing, run, write

# --------------------------------------------------------------------------
# Sizes.
# --------------------------------------------------------------------------


# The size grammar itself (one for --max-arena and --max-memory): tests/cli/test_sizes.py.


def test_a_bad_size_on_the_command_line_fails_before_compiling(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, str(tmp_path / "never_read.py"), "--max-arena", "12Q")
    assert code == 2
    assert out == ""
    first, hint, *_ = err.splitlines()
    assert first == "error[E0200]: --max-arena: '12Q' is not a size"
    assert hint.startswith("  hint: give bytes, or a number with K, M, G or T")


def test_format_size_keeps_the_exact_bytes() -> None:
    assert format_size(96) == "96 bytes"
    assert format_size(262144) == "256.0 KiB (262,144 bytes)"
    assert format_size(3 << 20) == "3.0 MiB (3,145,728 bytes)"


def test_no_limit_or_no_methods_always_pass() -> None:
    check_arena_limit({}, None)
    check_arena_limit({}, 0)
    with pytest.raises(UsageError, match="non-negative"):
        check_arena_limit({}, -1)


# --------------------------------------------------------------------------
# The limit on the command line.
# --------------------------------------------------------------------------


def summary_bytes(out: str) -> tuple[int, int]:
    """(arena, lower bound) in bytes from `compile --json`."""
    facts = json.loads(out)
    return facts["arena_bytes"], facts["arena_lower_bound_bytes"]


def test_a_plan_over_the_limit_fails_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the working directory
    write(tmp_path, "mlp.py", MLP)

    # A limit well above the plan: compiles, and reports the planned arena.
    code, out, err = run(capsys, "mlp.py", "-o", "roomy.pte", "--max-arena", "1M", "--json")
    assert code == 0, err
    arena, lower_bound = summary_bytes(out)
    # A limit of exactly the plan fits.
    code, out, err = run(capsys, "mlp.py", "-o", "exact.pte", "--max-arena", str(arena),
                         "--json")
    assert code == 0, err
    assert summary_bytes(out) == (arena, lower_bound)

    before = listing(tmp_path)
    code, out, err = run(capsys, "mlp.py", "-o", "tight.pte", "--max-arena", str(arena - 1))

    assert code == 3
    assert out == ""
    assert listing(tmp_path) == before  # no tight.pte, no temporary file
    first, hint, *_ = err.splitlines()
    assert first.startswith(
        f"error[E0312]: method 'forward' needs a memory arena of {arena} bytes, over the limit "
        f"of {arena - 1} bytes (lower bound {lower_bound} bytes); largest planned tensors: ")
    line = next(i for i, text in enumerate(MLP.splitlines(), start=1) if "return self.fc2" in text)
    where = f"at mlp.py:{line}: return self.fc2(torch.relu(self.fc1(x)))"
    # fc1's and relu's outputs (2 x 16 floats), then the input (2 x 8 floats).
    assert first.endswith(f"%addmm [2, 16] float32 128 bytes {where}, "
                          f"%relu [2, 16] float32 128 bytes {where}, "
                          "%x [2, 8] float32 64 bytes (an input)")
    reason = ("no plan fits: even the lower bound" if lower_bound > arena - 1
              else "the lower bound fits, this plan does not")
    assert hint.startswith(f"  hint: {reason}")
    assert hint.endswith("reduce batch/sequence bounds (the largest tensors are listed), "
                         "or raise --max-arena")


# --------------------------------------------------------------------------
# The Python API: each method is checked, dynamic dims at their upper bound.
# --------------------------------------------------------------------------


def test_the_method_over_the_limit_is_named_with_sizes_at_the_shape_bounds() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2)).eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    methods = {"batched": (model, (torch.randn(4, 4),), ({0: batch},))}
    options = CompileOptions(max_arena_bytes=1024)

    with pytest.raises(ArenaLimitError) as raised:
        # forward (batch 1) fits in 1 KiB; batched, planned for 64 rows, does not.
        compile_module(model, (torch.randn(1, 4),), methods=methods, options=options)

    error = raised.value
    assert (error.code, error.exit_code) == ("E0312", 3)
    assert error.message.startswith("method 'batched' needs a memory arena of ")
    assert "over the limit of 1.0 KiB (1,024 bytes)" in error.message
    relu = re.search(r"%relu \[(\w+), 8\] float32 (.+?) at ", error.message)
    assert relu is not None, error.message
    assert relu[2] == "2.0 KiB (2,048 bytes)"  # 64 x 8 floats
    assert relu[1] != "64"  # the symbolic dim, as the model wrote it


def test_when_the_lower_bound_fits_the_hint_says_so() -> None:
    # A stand-in planned program: the check reads only the plan and the graph.
    graph_module = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    set_memory_plan(graph_module, SimpleNamespace(arena_bytes=2048, lower_bound=1024))  # type: ignore[arg-type]
    program = SimpleNamespace(graph_module=graph_module)

    check_arena_limit({"forward": program}, 2048)  # type: ignore[dict-item]
    with pytest.raises(ArenaLimitError) as raised:
        check_arena_limit({"forward": program}, 1536)  # type: ignore[dict-item]

    assert str(raised.value) == (
        "method 'forward' needs a memory arena of 2.0 KiB (2,048 bytes), over the limit of "
        "1.5 KiB (1,536 bytes) (lower bound 1.0 KiB (1,024 bytes)); "
        "largest planned tensors: none")
    assert raised.value.hint is not None
    assert raised.value.hint.startswith("the lower bound fits, this plan does not; ")
