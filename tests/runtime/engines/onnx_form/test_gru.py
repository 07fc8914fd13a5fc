"""An unrolled GRU layer in the ONNX form is one ONNX GRU node
(exirc.runtime.engines.onnx_form.rewrites.gru): nn.GRU layers compiled for XNNPACK (one or
two layers, batch first or not, given or zero h0, no biases, bidirectional,
one step, batch one) run on onnxruntime with the torch engine's and eager's
answers, with the expected number of GRU nodes and, where the input
projection covers the whole sequence, that projection folded into the node.
Hand-written cells that are exactly torch's GRU fuse whatever order their
gates are chunked in; those that are not (a gate read elsewhere, a tanh where
a sigmoid belongs, the reset gate applied before the recurrent weight, the
update gate weighting the wrong state) stay as they are and still give
eager's answers. A bidirectional GRU tagger fuses into one chain with nothing
per step left."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.runtime.engines.onnx_form.test_chain_flip_lstm import Tagger, fused
from tests.runtime.engines.onnx_form.test_fusions import (  # noqa: F401 (onnx_ops: a fixture)
    onnx_ops,
)
from tests.runtime.engines.onnx_form.test_lstm import ops_compiled_against_eager

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")



class Layer(nn.Module):
    """An nn.GRU returning its sequence and final state (from a given one if any)."""

    def __init__(self, **options: object) -> None:
        super().__init__()
        self.gru = nn.GRU(**options)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = self.gru(x, state[0] if state else None)
        return out, h


class HandWritten(nn.Module):
    """One GRU layer written out step by step, time major, as torch decomposes it.
    `variant` changes it: "reordered" chunks the gates in other orders (still a
    GRU); "gate_read" also returns the sum of the update gates; "tanh_update_gate"
    uses tanh for the update gate; "reset_before_weight" multiplies h by the
    reset gate before the recurrent weight (ONNX's linear_before_reset=0, not
    torch's GRU); "update_swapped" keeps z of the candidate, not of h."""

    def __init__(self, variant: str = "", size: int = 4, hidden: int = 6) -> None:
        super().__init__()
        self.variant, self.hidden = variant, hidden
        self.w_ih = nn.Parameter(torch.randn(3 * hidden, size) * 0.5)
        self.w_hh = nn.Parameter(torch.randn(3 * hidden, hidden) * 0.5)
        self.b_ih = nn.Parameter(torch.randn(3 * hidden) * 0.5)
        self.b_hh = nn.Parameter(torch.randn(3 * hidden) * 0.5)
        # Parameters of their own: a slice or cat of one would be computed at run time.
        self.w_hh_n_r_z = nn.Parameter(torch.cat(_n_r_z(self.w_hh.detach())))
        self.b_hh_n_r_z = nn.Parameter(torch.cat(_n_r_z(self.b_hh.detach())))
        self.w_hn = nn.Parameter(self.w_hh.detach()[2 * hidden:].clone())
        self.b_hn = nn.Parameter(self.b_hh.detach()[2 * hidden:].clone())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(x.shape[1], self.hidden)
        updates, outs = torch.zeros_like(h), []
        for t in range(x.shape[0]):
            gi = x[t] @ self.w_ih.T + self.b_ih
            if self.variant == "reordered":  # x's chunks as z, n, r; h's as n, r, z
                i_z, i_n, i_r = gi.chunk(3, dim=-1)
                h_n, h_r, h_z = (h @ self.w_hh_n_r_z.T + self.b_hh_n_r_z).chunk(3, dim=-1)
            else:
                i_r, i_z, i_n = gi.chunk(3, dim=-1)
                h_r, h_z, h_n = (h @ self.w_hh.T + self.b_hh).chunk(3, dim=-1)
            r = torch.sigmoid(i_r + h_r)
            z = torch.tanh(i_z + h_z) if self.variant == "tanh_update_gate" else \
                torch.sigmoid(i_z + h_z)
            updates = updates + z
            if self.variant == "reset_before_weight":
                n = torch.tanh(i_n + (r * h) @ self.w_hn.T + self.b_hn)
            else:
                n = torch.tanh(i_n + r * h_n)
            h = (n - h) * z + h if self.variant == "update_swapped" else (h - n) * z + n
            outs.append(h)
        return torch.stack(outs), (updates if self.variant == "gate_read" else h)


def _n_r_z(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """torch's r, z, n blocks of a GRU weight or bias as n, r, z."""
    r, z, n = rows.chunk(3)
    return n, r, z


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    module: Callable[[], nn.Module]
    shapes: list[tuple[int, ...]]  # x, then h0 if given
    grus: int  # GRU nodes in the delegates' ONNX form
    # MatMuls left there (None: not counted): an input projection over the whole
    # sequence is folded into its GRU node (onnx_lstm_input); the backward
    # direction's only at chain level, through the flip; steps projected one by
    # one stay.
    matmuls: int | None = 0


def _layer(**options: object) -> Callable[[], nn.Module]:
    return lambda: Layer(**options)


CASES = [
    Case("one_layer", _layer(input_size=8, hidden_size=16), [(5, 2, 8)], 1),
    Case("two_layers_batch_first", _layer(input_size=8, hidden_size=16, num_layers=2,
                                          batch_first=True), [(2, 4, 8)], 2),
    Case("given_state", _layer(input_size=3, hidden_size=5), [(3, 2, 3), (1, 2, 5)], 1),
    Case("no_bias_batch_one_given_state_two_layers",
         _layer(input_size=4, hidden_size=4, num_layers=2, bias=False),
         [(3, 1, 4), (2, 1, 4)], 2),
    Case("no_bias_zero_state", _layer(input_size=4, hidden_size=5, bias=False), [(3, 2, 4)], 1),
    Case("bidirectional", _layer(input_size=3, hidden_size=5, bidirectional=True,
                                 batch_first=True), [(2, 3, 3)], 2, matmuls=1),
    Case("one_step_batch_one", _layer(input_size=4, hidden_size=6, num_layers=2,
                                      batch_first=True), [(1, 1, 4)], 2),
    Case("hand_written", HandWritten, [(4, 2, 4)], 1, matmuls=None),
    Case("gates_chunked_in_other_orders", lambda: HandWritten("reordered"), [(4, 2, 4)], 1,
         matmuls=None),
    Case("a_gate_read_elsewhere", lambda: HandWritten("gate_read"), [(4, 2, 4)], 0, None),
    Case("tanh_for_a_sigmoid", lambda: HandWritten("tanh_update_gate"), [(4, 2, 4)], 0, None),
    Case("reset_before_the_weight", lambda: HandWritten("reset_before_weight"), [(4, 2, 4)], 0,
         None),
    Case("update_gate_swapped", lambda: HandWritten("update_swapped"), [(4, 2, 4)], 0, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gru_layers_are_gru_nodes_with_eager_answers(
        case: Case, onnx_ops: list[list[str]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    ops = ops_compiled_against_eager(case.module, case.shapes, onnx_ops, monkeypatch)
    assert ops.count("GRU") == case.grus, ops
    assert case.matmuls is None or ops.count("MatMul") == case.matmuls, ops
    if case.grus:
        assert "Sigmoid" not in ops, ops  # every step is in the GRU nodes
    else:
        assert "Sigmoid" in ops, ops  # the cells are still there, step by step


@pytest.mark.parametrize("layers", [1, 2])
def test_a_bidirectional_gru_tagger_is_one_chain_of_gru_nodes(layers: int) -> None:
    torch.manual_seed(0)
    # `fused` checks the answers against the kernel-by-kernel run's and eager's.
    _, ops = fused(Tagger(layers, True, nn.GRU).eval(), [torch.randint(0, 50, (2, 7))])
    assert ops["GRU"] == 2 * layers, ops
    assert ops["MatMul"] == 1, ops  # the output Linear's: every projection is in its node
    assert ops["Gather"] == 1, ops  # the embedding's: no step is gathered from a Y
    assert "Sigmoid" not in ops, ops
