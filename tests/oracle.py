"""ExecuTorch as a test oracle for the program format.

Not a test module: helpers the format tests import. ExecuTorch is an optional
dependency, so every test that uses these helpers must carry
`requires_executorch`, and nothing here imports `executorch` at module import
time.

The reference models are small and deterministic (weights seeded per model),
and each exercises a different part of the format: constants, planned
memory, kernel argument kinds (ints, doubles, bools, lists, tensor lists,
optional tensor lists, nulls), integer tensors, several outputs, dynamic
shapes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import exirc.serialize.program as P

HAVE_EXECUTORCH = importlib.util.find_spec("executorch") is not None

requires_executorch = pytest.mark.skipif(
    not HAVE_EXECUTORCH, reason="needs ExecuTorch (the format test oracle) installed"
)


# --------------------------------------------------------------------------
# Reference models.
# --------------------------------------------------------------------------


class MLP(torch.nn.Module):
    """linear + relu + linear: permute_copy, addmm, constant weights."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(torch.nn.Module):
    """conv2d + batch norm (eval) + relu + max pool + avg pool."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        # Non-trivial running statistics so batch norm is not the identity.
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 4))
            self.bn.running_var.copy_(torch.linspace(0.5, 2.0, 4))
            self.bn.weight.copy_(torch.linspace(0.8, 1.2, 4))
            self.bn.bias.copy_(torch.linspace(-0.1, 0.1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        return torch.nn.functional.avg_pool2d(y, 2)


class Attention(torch.nn.Module):
    """Single-head self-attention: matmul, softmax, layer_norm, residual."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim)
        self.v = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        attn = torch.softmax(scores, dim=-1)
        return self.norm(x + torch.matmul(attn, v))


class EmbedCat(torch.nn.Module):
    """embedding + cat (TensorList) + split + slice."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)

    def forward(self, ids: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)  # [2, 3, 6]
        a, b = torch.split(e, [2, 4], dim=-1)  # [2, 3, 2], [2, 3, 4]
        c = torch.cat([b, a, extra], dim=-1)  # [2, 3, 8]
        return c[:, 1:, 2:7]


class MathReduce(torch.nn.Module):
    """Elementwise math (doubles, bools in arguments) and two outputs."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.exp(x * 0.5) + torch.sin(y) - torch.sqrt(torch.abs(x) + 1.0)
        z = torch.clamp(z, min=-2.0, max=3.0)
        s = z.sum(dim=1, keepdim=True)
        m = torch.amax(z, dim=0)
        return s / (z.mean() + 10.0), m * torch.tanh(y).mean(dim=0)


class IntIndex(torch.nn.Module):
    """int64 inputs: integer arithmetic and advanced indexing (OptionalTensorList)."""

    def forward(self, idx: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        picked = x[idx]  # index.Tensor: indices as an optional tensor list
        doubled = (idx * 3 + 1) % 5
        return picked * 2.0, doubled


class NoConstants(torch.nn.Module):
    """No weights and no scalar constants: ExecuTorch writes a file whose only
    segment is empty and which has no extended header."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + y) * x


class DynamicAdd(torch.nn.Module):
    """A batch dimension bounded above: dynamic-bound tensor shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


class Delegated(torch.nn.Module):
    """Lowered in part to a demo backend: delegate calls, inline delegate data
    and named data. The runtime has no such backend, so it is not runnable."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.sin(x) + y * 2.0) - x


def _demo_partitioner() -> Any:
    # ExecuTorch's own test backend that stores its payload as named data.
    from executorch.exir.backend.test.backend_with_named_data_map import (
        BackendWithNDMPartitioner,
    )

    return BackendWithNDMPartitioner()


@dataclass(frozen=True)
class OracleModel:
    """A reference model: how to build it, its example inputs, dynamic shapes.

    `partitioner` (a factory) lowers parts of the model to a backend;
    `runnable` is false when ExecuTorch's runtime cannot run the result.
    """

    name: str
    build: Callable[[], torch.nn.Module]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    dynamic_shapes: Callable[[], Any] | None = None
    partitioner: Callable[[], Any] | None = None
    runnable: bool = True

    def module(self) -> torch.nn.Module:
        torch.manual_seed(_seed(self.name))
        return self.build().eval()

    def inputs(self) -> tuple[torch.Tensor, ...]:
        generator_state = torch.random.get_rng_state()
        try:
            torch.manual_seed(_seed(self.name) + 1)
            return self.make_inputs()
        finally:
            torch.random.set_rng_state(generator_state)


def _seed(name: str) -> int:
    # Stable across runs (unlike hash()).
    return sum((i + 1) * ord(ch) for i, ch in enumerate(name)) % 10_000


def _dynamic_batch() -> Any:
    batch = torch.export.Dim("batch", min=1, max=8)
    return ({0: batch},)


MODELS: dict[str, OracleModel] = {
    m.name: m
    for m in [
        OracleModel("mlp", MLP, lambda: (torch.randn(2, 8),)),
        OracleModel("cnn", CNN, lambda: (torch.randn(1, 3, 8, 8),)),
        OracleModel("attention", Attention, lambda: (torch.randn(1, 5, 8),)),
        OracleModel(
            "embed_cat",
            EmbedCat,
            lambda: (torch.randint(0, 10, (2, 3), dtype=torch.int64), torch.randn(2, 3, 2)),
        ),
        OracleModel("math_reduce", MathReduce, lambda: (torch.randn(4, 5), torch.randn(4, 5))),
        OracleModel(
            "int_index",
            IntIndex,
            lambda: (torch.tensor([3, 0, 2, 2], dtype=torch.int64), torch.randn(5, 3)),
        ),
        OracleModel("no_constants", NoConstants, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
        OracleModel(
            "dynamic_add", DynamicAdd, lambda: (torch.randn(3, 4),), dynamic_shapes=_dynamic_batch
        ),
        OracleModel(
            "delegated",
            Delegated,
            lambda: (torch.randn(2, 3), torch.randn(2, 3)),
            partitioner=_demo_partitioner,
            runnable=False,
        ),
    ]
}

MODEL_NAMES: list[str] = list(MODELS)
RUNNABLE_MODEL_NAMES: list[str] = [name for name, m in MODELS.items() if m.runnable]


def model_inputs(name: str) -> tuple[torch.Tensor, ...]:
    """Fresh copies of the example inputs of model `name` (same values every call)."""
    return MODELS[name].inputs()


def reference_outputs(name: str) -> list[torch.Tensor]:
    """Eager PyTorch outputs of model `name` on its example inputs."""
    model = MODELS[name]
    with torch.no_grad():
        out = model.module()(*model.inputs())
    return list(out) if isinstance(out, (tuple, list)) else [out]


# --------------------------------------------------------------------------
# ExecuTorch: export and run.
# --------------------------------------------------------------------------


@functools.cache
def executorch_pte(name: str) -> tuple[bytes, Any]:
    """Export model `name` with ExecuTorch: the `.pte` bytes and its program.

    The program is ExecuTorch's own schema dataclass tree
    (`executorch.exir.schema.Program`) as it was before serialization, so
    constants are in `constant_buffer` there even though the bytes keep them
    in a segment. Memoized: treat the returned program as read-only.
    """
    from executorch.exir import to_edge, to_edge_transform_and_lower

    model = MODELS[name]
    dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    exported = torch.export.export(
        model.module(), model.inputs(), dynamic_shapes=dynamic_shapes, strict=False
    )
    if model.partitioner is None:
        edge = to_edge(exported)
    else:
        edge = to_edge_transform_and_lower(exported, partitioner=[model.partitioner()])
    manager = edge.to_executorch()
    return bytes(manager.buffer), manager.executorch_program


def executorch_read(pte_bytes: bytes) -> Any:
    """ExecuTorch's own Python reader: a `PTEFile` (program with segments
    restored into it, plus the named data store)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(bytes(pte_bytes))


def executorch_method(pte_bytes: bytes, name: str = "forward") -> Callable[[Sequence[Any]], Any]:
    """Method `name` of the program on ExecuTorch's runtime (`executorch.runtime`, its
    XNNPACK backend included), as a function of its inputs. The function keeps the
    Program alive: ExecuTorch's Method points into its Program, and a Method used
    after its Program is dropped crashes the process."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(bytes(pte_bytes))
    method = program.load_method(name)

    def execute(inputs: Sequence[Any]) -> Any:
        assert program is not None  # held for the method's sake
        return method.execute(list(inputs))
    return execute


def load_with_executorch(pte_bytes: bytes) -> Any:
    """Load a program with ExecuTorch's runtime (portable kernels)."""
    from executorch.extension.pybindings import portable_lib

    return portable_lib._load_for_executorch_from_buffer(bytes(pte_bytes))


def run_with_executorch(
    pte_bytes: bytes, inputs: Sequence[torch.Tensor], method: str = "forward"
) -> list[torch.Tensor]:
    """Run `method` of a program with ExecuTorch's runtime; outputs as tensors.

    Outputs are cloned: the runtime may hand back views of its planned memory.
    """
    module = load_with_executorch(pte_bytes)
    args = [t.clone() for t in inputs]
    outputs = module.forward(args) if method == "forward" else module.run_method(method, args)
    return [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]


# --------------------------------------------------------------------------
# Comparing exirc's program model with ExecuTorch's.
# --------------------------------------------------------------------------

# ExecuTorch's schema classes carry the same names as exirc's (both follow
# the schema), except that ET wraps union members in EValue / Instruction.
_ET_WRAPPERS = {"EValue": "val", "Instruction": "instr_args"}


def assert_same(ours: Any, theirs: Any, path: str) -> None:
    """Assert that exirc's `ours` holds what ExecuTorch's `theirs` does.

    Dataclasses are matched by class name and compared field by field (exirc
    field names are the schema's, as ExecuTorch's are); enums by value; an
    absent optional vector (None in ET) equals an empty list.
    """
    name = type(theirs).__name__
    if name in _ET_WRAPPERS:
        assert_same(ours, getattr(theirs, _ET_WRAPPERS[name]), path)
        return
    if dataclasses.is_dataclass(theirs):
        assert type(ours) is getattr(P, name, None), (
            f"{path}: ExecuTorch has {name}, exirc read {type(ours).__name__}: {ours!r}"
        )
        for f in dataclasses.fields(theirs):
            assert_same(getattr(ours, f.name), getattr(theirs, f.name), f"{path}.{f.name}")
    elif isinstance(theirs, enum.Enum):
        assert isinstance(ours, int) and int(ours) == theirs.value, (
            f"{path}: expected {theirs!r}, exirc read {ours!r}"
        )
    elif isinstance(theirs, (list, tuple)):
        # A call's arguments are read as `P.Args` (int32s), a list in all but cost.
        assert isinstance(ours, (list, P.Args)), f"{path}: expected a list, exirc read {ours!r}"
        assert len(ours) == len(theirs), (
            f"{path}: expected {len(theirs)} items, exirc read {len(ours)}"
        )
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{i}]")
    elif theirs is None:
        assert ours is None or ours == [], f"{path}: expected absent, exirc read {ours!r}"
    elif isinstance(theirs, bool):
        assert isinstance(ours, bool) and ours == theirs, f"{path}: expected {theirs}, got {ours!r}"
    elif isinstance(theirs, float) or path.endswith(".double_val"):
        # ET's Double may hold "inf"/"-inf"/"nan" as strings.
        expected, got = float(theirs), float(ours)
        assert (math.isnan(expected) and math.isnan(got)) or expected == got, (
            f"{path}: expected {theirs!r}, exirc read {ours!r}"
        )
    elif isinstance(theirs, (bytes, bytearray)):
        assert bytes(ours) == bytes(theirs), f"{path}: bytes differ"
    else:
        assert type(ours) is type(theirs) and ours == theirs, (
            f"{path}: expected {theirs!r}, exirc read {ours!r}"
        )


