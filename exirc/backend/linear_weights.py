"""Linear layers read their weight as stored: no transposed copy, at run time or in the file.

`aten.linear` reaches the Edge dialect as `mm(x, permute_copy(W, [1, 0]))`
(`addmm(b, x, ...)` with a bias; a [B, T, C] input is viewed to [B*T, C]
around it). Constant folding turns the permute into a transposed constant,
but only up to its `max_bytes`: a GPT-2 `lm_head` (50257 x 768 floats) stays a
copy of 147 MiB on every call, measured as half of a small GPT-2's run. And
when the weight is tied (the token embedding reads it too), folding would
store it twice, once per layout.

ATen's `linear` takes the weight as stored and hands BLAS its transposed view,
which costs nothing, so both become `linear(x, W[, b])`:

  * `mm(x, permute_copy(W, [1, 0]))` where W is a constant of the program;
  * `mm(x, C)` where C is a constant equal to the transpose of another
    constant W the program keeps anyway (constant folding's copy of a tied
    weight): C is dropped, W is stored once.

A transposed constant nothing else duplicates stays as it is (folded, for the
contiguous layout GEMM reads fastest).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import Node

from exirc.backend.ops import linear
from exirc.edge.constants import constant_tensor, remove_constant
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

aten = torch.ops.aten

_MATMULS = (aten.mm.default, aten.addmm.default)


def _is_transpose(node: object) -> bool:
    """Whether `node` is `permute_copy(W, [1, 0])` of a 2-D tensor."""
    if not isinstance(node, Node) or node.target is not aten.permute_copy.default:
        return False
    dims = node.args[1]
    return isinstance(dims, (list, tuple)) and list(dims) in ([1, 0], [-1, -2], [1, -2], [-1, 0])


def _plain_addmm(node: Node) -> bool:
    """An addmm that is `bias + mat1 @ mat2`, with no scaling of either."""
    beta = node.kwargs.get("beta", node.args[3] if len(node.args) > 3 else 1)
    alpha = node.kwargs.get("alpha", node.args[4] if len(node.args) > 4 else 1)
    return bool(beta == 1 and alpha == 1)


def _bias_fits(bias: object, features: int) -> bool:
    """Whether `bias` is one value per output feature, as linear's bias is
    (addmm also broadcasts a [M, N] or [1] bias, which linear kernels need not take)."""
    value = bias.meta.get("val") if isinstance(bias, Node) else None
    return isinstance(value, torch.Tensor) and tuple(value.shape) == (features,)


class _Duplicates:
    """The program's 2-D constants, to find the one a transposed constant duplicates."""

    def __init__(self, program: ExportedProgram) -> None:
        self._program = program
        self._by_layout: dict[tuple[tuple[int, ...], torch.dtype], list[Node]] = \
            defaultdict(list)
        for node in program.graph_module.graph.nodes:
            tensor = constant_tensor(program, node)
            if tensor is not None and tensor.dim() == 2:
                self._by_layout[tuple(tensor.shape), tensor.dtype].append(node)

    def original_of(self, transposed: Node) -> Node | None:
        """A constant W, other than `transposed`, holding exactly `transposed`'s
        transpose; None if there is none."""
        value = constant_tensor(self._program, transposed)
        if value is None or value.dim() != 2:
            return None
        rows, columns = value.shape
        for candidate in self._by_layout.get(((columns, rows), value.dtype), []):
            if candidate is transposed or not candidate.users:
                continue
            weight = constant_tensor(self._program, candidate)
            if weight is not None and torch.equal(weight.t(), value):
                return candidate
        return None


@dataclass(frozen=True)
class LinearWeights(Pass):
    """Edge/Backend -> Backend: `mm`/`addmm` by a constant weight's transpose
    become the backend op `linear` (`aten::linear.out`) on the weight as stored.

    Rewrites a matmul whose right operand is `permute_copy(W, [1, 0])` of a
    constant W, or a constant that equals the transpose of another constant
    the program keeps; an addmm only when it is unscaled and its bias has one
    value per output feature. Copies and duplicates left unread are dropped.
    Top-level graph only: control-flow branches keep their matmuls.
    """

    name: ClassVar[str] = "linear_weights"

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        duplicates = _Duplicates(program)
        replaced: set[Node] = set()
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _MATMULS:
                continue
            weight = self._weight(program, duplicates, node)
            if weight is None:
                continue
            bias = None
            if node.target is aten.addmm.default:
                bias = node.args[0]
                features = weight.meta["val"].shape[0]
                if not _plain_addmm(node) or not _bias_fits(bias, features):
                    continue
            mat1, mat2 = node.args[0:2] if bias is None else node.args[1:3]
            arguments = (mat1, weight) if bias is None else (mat1, weight, bias)
            with graph.inserting_before(node):
                fused = graph.call_function(linear, arguments)
            fused.meta.update(node.meta)
            node.replace_all_uses_with(fused)
            graph.erase_node(node)
            assert isinstance(mat2, Node)
            replaced.add(mat2)
        if not replaced:
            return PassResult(program, False)
        graph.eliminate_dead_code()
        for node in replaced:
            if node.graph is graph and node.op == "placeholder" and not node.users:
                remove_constant(program, node)
        program.graph_module.recompile()
        return PassResult(program, True)

    @staticmethod
    def _weight(program: ExportedProgram, duplicates: _Duplicates, matmul: Node) -> Node | None:
        """The stored weight W that `matmul`'s right operand transposes, if any."""
        mat2 = matmul.args[1] if matmul.target is aten.mm.default else matmul.args[2]
        if not isinstance(mat2, Node):
            return None
        if _is_transpose(mat2):
            source = mat2.args[0]
            if isinstance(source, Node) and constant_tensor(program, source) is not None:
                return source
            return None
        if constant_tensor(program, mat2) is not None:
            return duplicates.original_of(mat2)
        return None
