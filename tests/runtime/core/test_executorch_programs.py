"""ExecuTorch-produced programs run in exirc and match ExecuTorch's own runtime.

The oracle models of `tests/oracle.py` cover constants, planned memory, every
argument kind, integer tensors, several outputs and dynamic shapes. The
programs built here add what the emitter produces for control flow and
symbolic sizes: `torch.cond` (JumpFalseCall, MoveCall), `map` (a backward
loop with `et_copy_index`), views and arithmetic on sizes known only at run
time (`et_view`, `sym_size`, `executorch_prim::*`), and mutable state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from exirc.errors import UnsupportedOperatorError
from exirc.runtime import load
from tests.oracle import (
    MODELS,
    RUNNABLE_MODEL_NAMES,
    executorch_pte,
    load_with_executorch,
    model_inputs,
    reference_outputs,
    requires_executorch,
    run_with_executorch,
)

pytestmark = [requires_executorch, pytest.mark.oracle]

RTOL, ATOL = 1e-4, 1e-5


def assert_close(ours: Sequence[Any], theirs: Sequence[Any], what: str) -> None:
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: output {i}"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{what}: output {i}")


def saved(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / f"{name}.pte"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", RUNNABLE_MODEL_NAMES)
def test_oracle_model_matches_executorch_and_eager(name: str, tmp_path: Path) -> None:
    pte, _ = executorch_pte(name)
    program = load(saved(tmp_path, name, pte))
    inputs = model_inputs(name)
    ours = program.run("forward", list(inputs))
    assert_close(ours, run_with_executorch(pte, inputs), f"{name} vs ExecuTorch")
    assert_close(ours, reference_outputs(name), f"{name} vs eager")
    assert_close(program.run("forward", list(inputs)), ours, f"{name}, second run")


def test_dynamic_batch_sizes_match_eager_and_executorch(tmp_path: Path) -> None:
    pte, _ = executorch_pte("dynamic_add")
    program = load(saved(tmp_path, "dynamic_add", pte))
    module = MODELS["dynamic_add"].module()
    for batch in (1, 5, 8, 2):
        x = torch.randn(batch, 4)
        ours = program.run("forward", [x])
        with torch.no_grad():
            assert_close(ours, [module(x)], f"batch {batch} vs eager")
        assert_close(ours, run_with_executorch(pte, [x]), f"batch {batch} vs ExecuTorch")


def test_delegated_program_names_its_missing_backend(tmp_path: Path) -> None:
    pte, _ = executorch_pte("delegated")
    with pytest.raises(UnsupportedOperatorError, match="'BackendWithNamedDataMap'"):
        load(saved(tmp_path, "delegated", pte))


# ---------------------------------------------------------------------------
# Programs exercising the emitter's control flow and run-time sizes.
# ---------------------------------------------------------------------------


class Cond(torch.nn.Module):
    def forward(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(p.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos() + 1, (x,))


class Map(torch.nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from functorch.experimental import control_flow

        return control_flow.map(lambda x, y: x * y + 1, xs, y)


class SymSizes(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = x.shape[0]
        z = x.view(n * 2, -1) + 1
        return z.view(-1), torch.stack([x, y]), x.reshape(n, 2, 2).sum(1) * (n // 2 + 1)


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.full((2,), 3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return self.total * 2


def _sym_sizes_dynamic() -> Any:
    batch = torch.export.Dim("batch", min=2, max=8)
    return ({0: batch}, {0: batch})


PROGRAMS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], tuple[torch.Tensor, ...]],
                          Callable[[], Any] | None]] = {
    "cond": (Cond, lambda: (torch.ones(2), torch.randn(3)), None),
    "map": (Map, lambda: (torch.randn(4, 3), torch.randn(3)), None),
    "sym_sizes": (SymSizes, lambda: (torch.randn(4, 4), torch.randn(4, 4)), _sym_sizes_dynamic),
    "counter": (Counter, lambda: (torch.ones(2),), None),
}


@functools.cache
def compiled(name: str) -> bytes:
    from executorch.exir import ExecutorchBackendConfig, to_edge

    build, make_inputs, dynamic = PROGRAMS[name]
    exported = torch.export.export(build(), make_inputs(),
                                   dynamic_shapes=dynamic() if dynamic else None, strict=False)
    config = None
    if name == "counter":  # keep the buffer's initial value in the program
        from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

        config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["total"])])
    return bytes(to_edge(exported).to_executorch(config).buffer)


CASES: list[tuple[str, Callable[[], tuple[torch.Tensor, ...]]]] = [
    ("cond", lambda: (torch.ones(2), torch.randn(3))),
    ("cond", lambda: (-torch.ones(2), torch.randn(3))),
    ("map", lambda: (torch.randn(4, 3), torch.randn(3))),
    ("sym_sizes", lambda: (torch.randn(4, 4), torch.randn(4, 4))),
    ("sym_sizes", lambda: (torch.randn(2, 4), torch.randn(2, 4))),
    ("sym_sizes", lambda: (torch.randn(7, 4), torch.randn(7, 4))),
]


@pytest.mark.parametrize(("name", "make_inputs"), CASES,
                         ids=[f"{name}-{i}" for i, (name, _) in enumerate(CASES)])
def test_control_flow_and_run_time_sizes(name: str, make_inputs: Callable[[], Any],
                                         tmp_path: Path) -> None:
    data = compiled(name)
    program = load(saved(tmp_path, name, data))
    torch.manual_seed(0)
    inputs = make_inputs()
    ours = program.run("forward", list(inputs))
    with torch.no_grad():
        eager = PROGRAMS[name][0]()(*inputs)
    assert_close(ours, list(eager) if isinstance(eager, tuple) else [eager], f"{name} vs eager")
    assert_close(ours, run_with_executorch(data, inputs), f"{name} vs ExecuTorch")


def test_mutable_state_persists_across_runs_like_executorch(tmp_path: Path) -> None:
    data = compiled("counter")
    ours = load(saved(tmp_path, "counter", data))
    theirs = load_with_executorch(data)
    for step in range(3):
        x = torch.full((2,), float(step + 1))
        assert_close(ours.run("forward", [x]), theirs.forward([x.clone()]), f"run {step}")
