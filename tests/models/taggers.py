"""Sequence taggers over 16 steps of a batch-first input: issue 35's LSTM and
GRU taggers, whose input weights matmul broadcasts over the time steps.

Not in the zoo (`tests.models.zoo.ZOO`, which many suites run whole): the
size tests (`tests/emit/test_constants_once.py`) and `make bench`'s
`file_size` section use them.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.models.zoo import ZooModel


class SequenceTagger(nn.Module):
    """Embedding, a two-layer recurrence (`cell`, batch first), per-step tags."""

    def __init__(self, cell: type[nn.LSTM] | type[nn.GRU]) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 48)
        self.rnn = cell(48, 32, num_layers=2, batch_first=True)
        self.tag = nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(ids))
        return self.tag(out)


def _ids() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 100, (2, 16)),)


TAGGERS: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("lstm_tagger_16", lambda: SequenceTagger(nn.LSTM), _ids, ("lstm", "embedding")),
        ZooModel("gru_tagger_16", lambda: SequenceTagger(nn.GRU), _ids, ("gru", "embedding")),
    ]
}
