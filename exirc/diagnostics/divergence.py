"""What localizing a wrong result finds: the first instruction that diverges.

`exirc.diagnostics.localize` searches for it; `Divergence` is what it
reports, and a `LocalizeError` why it could not run the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from exirc.diagnostics.compare import Difference

PLANNED = "planned"  # the culprit disagrees with torch running the planned graph
CAPTURED = "captured"  # the planned graph disagrees with the captured model


@dataclass(frozen=True)
class Divergence:
    """The first instruction whose result differs from its reference."""

    method: str
    instruction: int  # index in chain 0
    op: str  # "aten::relu.out"
    node: str  # the graph node it was made for
    source: str | None  # "model.py:14: return torch.relu(x)"
    module: str | None  # "block.fc (Linear)"
    difference: Difference
    actual: str  # a preview of the first values
    expected: str
    against: str = PLANNED
    execution: int = 1  # which run of the instruction (> 1 in loops)
    loop: str | None = None  # the innermost loop around it: "%map_out at model.py:9: ..."
    captured_op: str | None = None  # with CAPTURED: what the captured node computed

    def lines(self) -> list[str]:
        """The report, a line per fact."""
        if self.against == PLANNED:
            head = f"first diverging instruction: {self.instruction} {self.op} (node %{self.node})"
        else:
            head = (f"first node a pass changed: %{self.node}, instruction {self.instruction} "
                    f"{self.op} (captured as {self.captured_op})")
        lines = [head]
        if self.loop is not None:
            lines.append(f"inside the loop {self.loop}, on execution {self.execution}")
        lines.append(f"source: {self.source or 'unknown'}")
        if self.module is not None:
            lines.append(f"module: {self.module}")
        reference = ("torch's kernels on the same inputs" if self.against == PLANNED
                     else "the captured model")
        lines.append(f"vs {reference}: {self.difference.describe()}")
        lines.append(f"got      {self.actual}")
        lines.append(f"expected {self.expected}")
        return lines


class LocalizeError(Exception):
    """Torch could not run a node of the planned graph; the message is one line."""


def describe_failure(error: BaseException) -> str:
    """One line for a failure to localize: `ValueError: first line of its message`."""
    first = (str(error).strip().splitlines() or [""])[0]
    return first if isinstance(error, LocalizeError) else f"{type(error).__name__}: {first}"

