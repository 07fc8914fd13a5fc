"""Rule 5 of `onnx_reshapes`: a batched MatMul on the batch dims it was given.

XNNPACK's batch matrix multiply takes one batch dim, so attention on
[B, heads, T, D] is emitted as Reshape(-> [B*heads, T, D]) on each operand,
a MatMul, and a Reshape back to [B, heads, T, N]: three Reshapes that
onnxruntime runs as nodes of their own. ONNX's MatMul broadcasts over any
number of batch dims, so the MatMul can read the operands' 4-D sources and
write the 4-D result itself. Each product is the same matrix product on the
same elements, so the results are exactly the same.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exirc.runtime.engines.onnx_form.rewrites.reshapes import (
        ReshapeNode,
        ReshapeRewriter,
        Shape,
    )


def matmul_on_batch_dims(rewriter: ReshapeRewriter, last: ReshapeNode) -> bool:
    """Reshape(a: [*L, m, k] -> [prod L, m, k]), Reshape(b: [*L, k, n] -> ...) ->
    MatMul -> Reshape(`last`: -> [*L, m, n]) becomes MatMul(a, b) writing `last`'s
    output, when the middle values have no other reader and no Reshape removed
    lets onnxruntime fuse the MatMul with a neighbour (`ReshapeRewriter._fuses`).
    Takes and returns the rewriter's ONNX graph; True if it rewrote."""
    product = last.input[0]
    matmul = rewriter.made_by(product, "MatMul")
    if matmul is None or rewriter.sole_reader(product) is None or len(matmul.input) != 2:
        return False
    target = rewriter.shapes[last.output[0]]
    flat = rewriter.shapes.get(product)
    if flat is None or len(flat) != 3 or len(target) < 4 or \
            target[-2:] != flat[-2:] or prod(target[:-2]) != flat[0]:
        return False
    batch = target[:-2]
    operands: list[ReshapeNode] = []
    sources: list[str] = []
    for name in matmul.input:
        reshape = rewriter.made_by(name, "Reshape")
        if reshape is None or rewriter.sole_reader(name) is None or \
                reshape.input[0] not in rewriter.shapes:
            return False
        operands.append(reshape)
        source: Shape = rewriter.shapes[reshape.input[0]]
        if source[:-2] != batch or source[-2:] != rewriter.shapes[name][-2:]:
            return False
        sources.append(reshape.input[0])
    if matmul.input[0] == matmul.input[1] or \
            rewriter._fuses(matmul, rewriter.readers(last.output[0])) or \
            any(rewriter._fuses(rewriter.producer(s), [matmul]) for s in sources):
        return False
    matmul.input[:] = sources
    matmul.output[0] = last.output[0]
    rewriter.shapes[last.output[0]] = target
    for node in (*operands, last):
        rewriter.nodes.remove(node)
    return True
