"""Nothing stored twice: each weight's bytes are in the file once, after
folding, across methods and delegates, and between a delegate's named data
and the program's own constants (issue 35). The files run as eager on
exirc's runtime and ExecuTorch's, and are no bigger than ExecuTorch's own.

A weight counts as stored once when its bytes, or its transpose's (folding
stores a linear's weight transposed for the portable kernels), occur once
in the file, and the size report finds no duplicate bytes.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.inspector.size import size_report
from exirc.runtime import load
from tests.models.zoo import ZOO, flatten_outputs
from tests.oracle import requires_executorch

TARGETS = ("portable", "xnnpack")
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


class Tagger(nn.Module):
    """Embedding, a two-layer recurrence over 16 steps of a batch-first input,
    per-step tags: the input weights are broadcast over the time steps."""

    def __init__(self, cell: type[nn.LSTM] | type[nn.GRU]) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 48)
        self.rnn = cell(48, 32, num_layers=2, batch_first=True)
        self.tag = nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(ids))
        return self.tag(out)


class SharedWeight(nn.Module):
    """Two linears reading one weight, with a cumulative sum (which XNNPACK does
    not run) between them: on XNNPACK, two delegates read it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)).cumsum(-1))


class TiedHead(nn.Module):
    """An embedding and an LM head sharing their table (a kernel does the
    lookup, XNNPACK the head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 256, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(ids)))


def _ids(high: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(1))


def _model(name: str) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    if name == "lstm_tagger":
        return Tagger(nn.LSTM).eval(), (_ids(100, (2, 16)),)
    if name == "gru_tagger":
        return Tagger(nn.GRU).eval(), (_ids(100, (2, 16)),)
    if name == "shared_weight":
        return SharedWeight().eval(), (torch.randn(4, 64),)
    if name == "tied_head":
        return TiedHead().eval(), (_ids(256, (1, 8)),)
    zoo = ZOO[name]
    return zoo.module(), zoo.inputs()


MODELS = ["lstm_tagger", "gru_tagger", "shared_weight", "tied_head",
          pytest.param("gpt2_lm_head", marks=pytest.mark.skipif(
              not HAVE_TRANSFORMERS, reason="needs transformers"))]

_compiled: dict[tuple[str, str], bytes] = {}


def _compiled_file(name: str, target: str) -> bytes:
    if (name, target) not in _compiled:
        model, inputs = _model(name)
        _compiled[name, target] = compile_module(
            model, inputs, options=CompileOptions(target=target)).data
    return _compiled[name, target]


def _copies(data: bytes, weight: torch.Tensor) -> int:
    """How many times `weight`'s bytes, or its transpose's, occur in `data`."""
    w = weight.detach()
    found = data.count(w.contiguous().numpy().tobytes())
    if w.dim() == 2:
        found += data.count(w.t().contiguous().numpy().tobytes())
    return found


def _eager(model: nn.Module, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return flatten_outputs(model(*inputs))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_each_weight_is_stored_once(name: str, target: str) -> None:
    model, _ = _model(name)
    data = _compiled_file(name, target)
    report = size_report(data)
    assert report.duplicates == [], [d.to_json() for d in report.duplicates]
    weights = {id(p): p for p in model.parameters() if p.dim() == 2 and p.nbytes >= 1024}
    assert weights
    # Once at most: a weight folded into what it computes (GPT-2's position
    # table, looked up at constant positions) is not stored at all.
    stored = {name_: _copies(data, param) for name_, param in
              model.named_parameters(remove_duplicate=True) if id(param) in weights}
    assert all(copies <= 1 for copies in stored.values()), stored
    assert sum(stored.values()) >= len(stored) - 1, stored


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_files_run_as_eager_on_exircs_runtime(name: str, target: str) -> None:
    model, inputs = _model(name)
    outputs = load(_compiled_file(name, target)).run("forward", list(inputs))
    for got, want in zip(outputs, _eager(model, inputs), strict=True):
        torch.testing.assert_close(torch.as_tensor(got), want, rtol=1e-4, atol=1e-4)


def _executorch_file(model: nn.Module, inputs: tuple[Any, ...], target: str) -> bytes:
    from executorch.exir import to_edge, to_edge_transform_and_lower

    exported = torch.export.export(model, inputs)
    if target == "portable":
        return bytes(to_edge(exported).to_executorch().buffer)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(lowered.to_executorch().buffer)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_files_run_as_eager_on_executorchs_runtime(name: str, target: str) -> None:
    from executorch.runtime import Runtime

    model, inputs = _model(name)
    method = Runtime.get().load_program(_compiled_file(name, target)).load_method("forward")
    outputs = method.execute(list(inputs))
    for got, want in zip(outputs, _eager(model, inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("name", ["lstm_tagger", "gru_tagger", "tied_head"])
def test_xnnpack_file_is_no_bigger_than_executorchs(name: str) -> None:
    model, inputs = _model(name)
    ours = _compiled_file(name, "xnnpack")
    theirs = _executorch_file(model, inputs, "xnnpack")
    assert len(ours) <= len(theirs), f"{name}: {len(ours):,} B against {len(theirs):,} B"


def test_a_weight_two_delegates_read_is_named_data_once() -> None:
    from exirc.serialize import deserialize

    program = deserialize(_compiled_file("shared_weight", "xnnpack"))
    assert len(program.execution_plan[0].delegates) == 2
    model, _ = _model("shared_weight")
    filter_bytes = model.a.weight.detach().contiguous().numpy().tobytes()
    holding = [n.key for n in program.named_data
               if bytes(program.segments[n.segment_index].data) == filter_bytes]
    assert len(holding) == 1


def test_a_tied_table_is_one_constant_the_delegate_reads_in_place() -> None:
    from exirc.serialize import deserialize

    data = _compiled_file("tied_head", "xnnpack")
    program = deserialize(data)
    model, _ = _model("tied_head")
    table = model.emb.weight.detach().contiguous().numpy().tobytes()
    (named,) = [n for n in program.named_data
                if bytes(program.segments[n.segment_index].data) == table]
    constants = program.constant_segment
    assert constants is not None
    holder, offset = program.segments[named.segment_index].inside or (-1, -1)
    assert holder == constants.segment_index and offset in constants.offsets
    (row,) = [r for r in size_report(data).rows if r.detail.get("shared_with")]
    assert row.kind == "constant" and row.nbytes == len(table)
    assert row.detail["shared_with"] == [f"named data {named.key[:8] + '...'!r}"]


class TwoMethods(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Doubled(nn.Module):
    def __init__(self, inner: TwoMethods) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


class TwoStates(nn.Module):
    """Two buffers the model updates, both starting at zeros (a KV cache's keys
    and values): their initial values are one stored buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(64, 16))
        self.register_buffer("v", torch.zeros(64, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.k.add_(x)
        self.v.sub_(x)
        return self.k * self.v


@pytest.mark.parametrize("target", TARGETS)
def test_a_weight_two_methods_read_is_stored_once(target: str) -> None:
    torch.manual_seed(0)
    model, x = TwoMethods().eval(), torch.randn(2, 32)
    data = compile_module(model, (x,), methods={"doubled": (Doubled(model).eval(), (x,))},
                          options=CompileOptions(target=target)).data
    assert _copies(data, model.fc.weight) == 1
    assert size_report(data).duplicates == []
    program = load(data)
    torch.testing.assert_close(torch.as_tensor(program.run("doubled", [x])[0]),
                               model(x).detach() * 2, rtol=1e-4, atol=1e-4)


def test_equal_initial_states_are_stored_once() -> None:
    x = torch.randn(64, 16)
    data = compile_module(TwoStates(), (x,)).data
    assert size_report(data).duplicates == []
    program = load(data)
    model = TwoStates()
    for _ in range(2):
        torch.testing.assert_close(torch.as_tensor(program.run("forward", [x])[0]), model(x))
