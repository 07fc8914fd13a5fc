"""The submodule each instruction came from (`serialize.module_paths`).

The emitter knows, per instruction, the graph node it was made for; the
node's `nn_module_stack` meta, which torch.export records and every pass
copies along with the node, names the submodule (`exirc.ir.source.module_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exirc.ir.source import module_path


def instruction_module_paths(nodes: Sequence[Any]) -> list[str] | None:
    """Each instruction's module path, for the nodes the instructions were made
    for; None when no instruction has one (nothing worth storing)."""
    paths = [module_path(node) for node in nodes]
    return paths if any(paths) else None
