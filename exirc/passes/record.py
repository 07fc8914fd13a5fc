"""What the runner records of each pass it runs: the rows of timings and dumps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PassRecord:
    method: str
    stage: str
    name: str
    seconds: float
    changed: bool  # what the pass claims (PassResult.changed)
    nodes: int  # after the pass
    nodes_before: int = 0
    # Whether the graph text differs from before the pass; None when no
    # instrumentation needed the text (it costs a print_readable per pass).
    graph_changed: bool | None = None
    dump_file: str | None = None  # names inside the dump directory
    diff_file: str | None = None
    diff_page: str | None = None  # the diff as coloured HTML

    @property
    def label(self) -> str:
        return f"{self.stage}/{self.name} ({self.method})"

    @property
    def misreported(self) -> bool:
        """The pass changed the graph text but said it changed nothing."""
        return self.graph_changed is True and not self.changed
