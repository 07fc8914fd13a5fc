"""ATen dialect -> core ATen: decompose every op the Edge dialect does not admit.

The Edge dialect admits only core ATen ops, each functional. This pass
lowers the rest through torch's decomposition tables; `views_to_copies`
then makes the views functional.
"""

from __future__ import annotations

import os
import traceback
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from exirc.edge.cia_walks import cia_walks_on_change
from exirc.edge.decompositions import EXTRA_DECOMPOSITIONS
from exirc.edge.ops import is_edge_op
from exirc.errors import ModelError
from exirc.ir.control_flow import all_nodes
from exirc.ir.meta import carry_method_notes
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass(frozen=True)
class ToEdge(Pass):
    """ATen -> core ATen: run torch's core decomposition table.

    `keep` names ops (e.g. "aten.linear.default") left undecomposed because a
    target has a kernel for them that beats their decomposition.
    """

    name: ClassVar[str] = "to_edge"
    keep: tuple[str, ...] = ()

    def run(self, program: ExportedProgram) -> PassResult:
        with cia_walks_on_change():
            return self._decomposed(program)

    def _decomposed(self, program: ExportedProgram) -> PassResult:
        before = program.graph_module
        table = torch.export.default_decompositions()
        table.update(EXTRA_DECOMPOSITIONS)
        for op_name in self.keep:
            table.pop(_resolve_op(op_name), None)
        with warnings.catch_warnings():
            # torch warns about its own internals here (pytree's LeafSpec), which
            # says nothing to a user and would be the first line of `-v` output.
            warnings.simplefilter("ignore", FutureWarning)
            program = _decompose(program, table)
            # torch's default table keeps some non-core ops (linalg_vector_norm)
            # that another of its decompositions lowers to core ops. Use those,
            # one op at a time, and only when the result is core ATen: a lowering
            # to `prims` would hide the user's op behind one they never wrote.
            for op, decomposition in _decomposable_leftovers(program).items():
                candidate = _decompose(program, {op: decomposition})
                if _core_only(candidate):
                    program = candidate
        carry_method_notes(before, program.graph_module)
        return PassResult(program, changed=True)


class TorchDecompositionError(ModelError):
    """torch's own decomposition of an exported program failed, inside torch."""

    code = "E0313"
    default_hint = ("simplify the construct torch fails on, or report it to PyTorch with the "
                    "--debug traceback; ExecuTorch's to_edge runs the same torch function")


def _decompose(program: ExportedProgram, table: dict[Any, Any]) -> ExportedProgram:
    """`program.run_decompositions(table)`; a failure there that is not in a
    decomposition of exirc's is a TorchDecompositionError naming where it happened."""
    try:
        return program.run_decompositions(table)
    except Exception as error:
        frame = _innermost_frame(error)
        if frame is None or _is_exirc(frame.filename):
            raise  # ours: the pass runner reports it as a bug of exirc
        relative = _torch_relative(frame.filename)
        inside = "inside torch" if relative.startswith("torch" + os.sep) \
            else "in code torch called"
        first = (str(error).strip().splitlines() or [""])[0]
        raise TorchDecompositionError(
            f"torch could not decompose the exported program: {type(error).__name__}: "
            f"{first} (the failure is {inside}, not in exirc: torch {torch.__version__}'s "
            f"torch.export.ExportedProgram.run_decompositions, at {relative}:{frame.lineno} "
            f"in {frame.name})",
            hint="a common cause is an in-place write into a tensor the model reaches "
                 "through a plain Python object instead of a registered buffer: register it "
                 "with register_buffer(name, tensor, persistent=False). Otherwise simplify "
                 "the construct torch fails on, or report it to PyTorch with the --debug "
                 "traceback (ExecuTorch's to_edge calls the same torch function)") from error


def _innermost_frame(error: BaseException) -> traceback.FrameSummary | None:
    frames = traceback.extract_tb(error.__traceback__)
    return frames[-1] if frames else None


def _is_exirc(filename: str) -> bool:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(filename).startswith(package + os.sep)


def _torch_relative(filename: str) -> str:
    """`torch/_functorch/...py` for a file inside torch's package, else the path
    (relative to the working directory when it is under it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    path = os.path.abspath(filename)
    if path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    here = os.getcwd()
    return os.path.relpath(path, here) if path.startswith(here + os.sep) else filename


def _non_core_targets(program: ExportedProgram) -> set[Any]:
    return {node.target for node in all_nodes(program.graph_module)
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.core not in node.target.tags and not node.target.is_view}


def _core_only(program: ExportedProgram) -> bool:
    return all(is_edge_op(target) for target in _non_core_targets(program))


def _decomposable_leftovers(program: ExportedProgram) -> dict[Any, Any]:
    from torch._decomp import decomposition_table

    return {target: decomposition_table[target] for target in _non_core_targets(program)
            if target in decomposition_table}


def _resolve_op(qualified: str) -> torch._ops.OpOverload:
    namespace, name, overload = qualified.split(".")
    packet = getattr(getattr(torch.ops, namespace), name)
    op: torch._ops.OpOverload = getattr(packet, overload)
    return op
