"""A partition after lowering: the payload its backend made, and the graph it
stands for.

A `LoweredDelegate` is the call target of a delegate call node in the
Backend dialect: `%d = call_function[target=XnnpackBackend_0](args=(%x, ...))`,
returning a tuple that `getitem` nodes unpack. Calling it runs the partition's
original graph (with its weights), so a lowered program still runs in eager
mode, can be retraced, and `--verify` compares it with the model like any
other program. The plan stage turns it into `DelegateWithOuts`, which writes
its results into planned memory as every out-variant does, and the emitter
makes that a `DelegateCall` instruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from exirc.backend.delegation.interface import PartitionGraph, PreprocessResult


class LoweredDelegate:
    """One delegate of a program: backend id, payload and the partition it replaced."""

    def __init__(self, name: str, backend_id: str, partition: PartitionGraph,
                 result: PreprocessResult) -> None:
        self.name = name
        self.backend_id = backend_id
        self.partition = partition
        self.result = result

    @property
    def __name__(self) -> str:  # torch.fx names a call target by it in generated code
        return self.name

    def __repr__(self) -> str:
        return f"{self.name}({self.backend_id}, {len(self.result.processed)} B)"

    def __call__(self, *inputs: Any) -> tuple[torch.Tensor, ...]:
        given = iter(inputs)
        args = [self.partition.constants[p.target] if p.target in self.partition.constants
                else next(given) for p in self.partition.placeholders]
        results = self.partition.graph_module(*args)
        return tuple(results)

    @property
    def out_form(self) -> DelegateWithOuts:
        return DelegateWithOuts(self)


class DelegateWithOuts:
    """The out-variant form of a delegate call: `(inputs, *, out=[allocs])`.

    Its schema says it writes `out`, so the memory planner sees the outputs
    as written by this call and keeps its inputs live until it runs.
    """

    _schema = torch._C.parse_schema(
        "exirc::call_delegate(Tensor[] inputs, *, Tensor(a!)[] out) -> ()")

    def __init__(self, delegate: LoweredDelegate) -> None:
        self.delegate = delegate

    @property
    def __name__(self) -> str:
        return f"{self.delegate.name}_out"

    def __repr__(self) -> str:
        return f"{self.delegate!r}.out"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DelegateWithOuts) and other.delegate is self.delegate

    def __hash__(self) -> int:
        return hash(id(self.delegate))

    def __call__(self, inputs: Sequence[torch.Tensor], *,
                 out: Sequence[torch.Tensor]) -> None:
        for target, result in zip(out, self.delegate(*inputs)):
            target.resize_(result.shape).copy_(result)


def is_delegate_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, LoweredDelegate)


def is_delegate_out(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, DelegateWithOuts)
