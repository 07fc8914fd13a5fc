"""Models whose parameters share one tensor: a weight two linears read, and an
embedding table tied to the LM head (issue 35, "nothing stored twice").

Not in the zoo (`tests.models.zoo.ZOO`, which many suites run whole): the
size tests (`tests/emit/test_constants_once.py`) and `make bench`'s
`file_size` section use them.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.models.zoo import ZooModel


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


TIED: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("shared_weight", SharedWeight, lambda: (torch.randn(4, 64),), ("mlp",)),
        ZooModel("tied_head", TiedHead, lambda: (torch.randint(0, 256, (1, 8)),),
                 ("embedding", "layer_norm")),
    ]
}
