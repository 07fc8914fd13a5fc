"""8da4w / 8da8w linear layers under a dynamic length, delegated to XNNPACK (issue 32).

XNNPACK's per-token Convert (fp32 -> qdint8, parameters chosen per row at run
time) and its qd8 fully connected resize their rows with the input, so the
payload carries the bound, as ExecuTorch 1.5.1's own dynamic 8da lowering
writes it (torchao's `quantize_` + `XnnpackPartitioner`: [1, BOUND, in] values,
`PerTokenDynamicQuant(num_nonbatch_dims=1)`). Every length from 1 to the bound
runs on both runtimes equal to the quantized eager model.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.export import Dim

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.delegates import program_payloads
from exirc.runtime import load
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests.oracle import requires_executorch

BOUND, WIDTH = 8, 64
MODES = ("8da4w", "8da8w")


class Mlp(nn.Module):
    """Fully connected layers and exact float ops only (ReLU, a residual add)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) + x


class Gated(nn.Module):
    """Two layers reading one input (as a gated MLP's, or attention's q, k and v)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH, bias=False)
        self.down = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.gate(x)) * self.up(x))


MODELS = {"mlp": Mlp, "gated": Gated}


def _input(length: int, rank: int) -> torch.Tensor:
    x = torch.randn(1, length, WIDTH, generator=torch.Generator().manual_seed(length)) * 2
    return x if rank == 3 else x[0]


@functools.cache
def _compiled(mode: str, rank: int, model: str = "mlp") -> CompileResult:
    torch.manual_seed(4)
    return compile_module(MODELS[model]().eval(), (_input(5, rank),),
                          dynamic_shapes=({rank - 2: Dim("seq", min=1, max=BOUND)},),
                          options=CompileOptions(target="xnnpack", quantize=mode,
                                                 min_sqnr_db=10.0))


@pytest.mark.parametrize("mode", MODES)
def test_the_layers_are_delegated_with_per_token_converts_at_the_bound(mode: str) -> None:
    result = _compiled(mode, 3)
    assert {e.op for e in result.delegation["forward"].left_out} == {"sym_size.int"}
    (payload,) = program_payloads(result.program)
    graph = deserialize_blob(payload.data).graph
    kinds = [node.kind for node in graph.nodes]
    assert kinds.count(G.NodeKind.FULLY_CONNECTED) == 2 and kinds.count(G.NodeKind.CONVERT) == 2
    # The ReLU between the layers is the first one's clamp, not a node of its own
    # (the fifth node is the residual add).
    assert len(kinds) == 5 and G.NodeKind.CLAMP not in kinds
    assert [n.output_min_max for n in graph.nodes if n.kind == G.NodeKind.FULLY_CONNECTED] \
        == [(0.0, float("inf")), None]
    converted = [graph.values[n.params.output_id] for n in graph.nodes  # type: ignore[union-attr]
                 if n.kind == G.NodeKind.CONVERT]
    assert [(v.datatype, v.dims, v.quant) for v in converted] == [
        (G.Datatype.QDINT8, [1, BOUND, WIDTH], G.PerTokenDynamicQuant(1)),
        (G.Datatype.QDINT8, [1, BOUND, 2 * WIDTH], G.PerTokenDynamicQuant(1))]


@pytest.mark.parametrize("mode", MODES)
def test_layers_reading_one_input_share_its_convert(mode: str) -> None:
    (payload,) = program_payloads(_compiled(mode, 3, "gated").program)
    graph = deserialize_blob(payload.data).graph
    converts = [n.params.output_id for n in graph.nodes  # type: ignore[union-attr]
                if n.kind == G.NodeKind.CONVERT]
    read = [n.params.input1_id for n in graph.nodes  # type: ignore[union-attr]
            if n.kind == G.NodeKind.FULLY_CONNECTED]
    assert len(converts) == 2 and len(read) == 3
    assert sorted(read) == sorted([converts[0], converts[0], converts[1]])


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize(("rank", "model"), [(2, "mlp"), (3, "mlp"), (3, "gated")])
@pytest.mark.parametrize("mode", MODES)
def test_every_length_matches_the_quantized_model_on_both_runtimes(mode: str, rank: int,
                                                                  model: str) -> None:
    from executorch.runtime import Runtime

    result = _compiled(mode, rank, model)
    quantized = result.quantized_modules["forward"]
    ours = load(result.data)
    program = Runtime.get().load_program(result.data)  # alive while its method runs
    theirs = program.load_method("forward")
    for length in range(1, BOUND + 1):
        x = _input(length, rank)
        with torch.no_grad():
            expected = quantized(x)
        (got_ours,) = ours.run("forward", [x])
        (got_theirs,) = theirs.execute((x,))
        # Fully connected layers and exact float ops: the two runtimes agree bit
        # for bit; eager's per-token parameters may differ from XNNPACK's in a
        # scale's last bit, moving an output by at most one quantization step.
        assert torch.equal(got_ours, got_theirs), (mode, rank, model, length)
        step = float(expected.amax() - expected.amin()) / 255
        worst = float((got_ours - expected).abs().max())
        assert got_ours.shape == expected.shape and worst <= step, (mode, rank, model, length,
                                                                    worst)
