"""The names a method's inputs and outputs are stored under (`serialize.io_names`).

Inputs are named after the forward parameters torch.export named their
placeholders for (`input_ids`); outputs after their path in what forward
returned: the keys of a dict or a `ModelOutput`, attribute names, and indices
inside them (`logits`, `past_key_values.0.1`). Positions in a plain tuple
carry no name, so an output whose path has no key is `output_N`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.utils import _pytree as pytree

from exirc.serialize.io_names import MethodNames, default_names, usable

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def method_io_names(exported: ExportedProgram, inputs: list[str],
                    output_count: int) -> MethodNames | None:
    """The names of a method's inputs (its input placeholders' names, given) and
    of its `output_count` outputs; None when there is nothing better than the
    defaults to store."""
    defaults = default_names(len(inputs), output_count)
    outputs = output_names(exported.call_spec.out_spec, output_count)
    named = MethodNames(inputs if usable(inputs) else defaults.inputs,
                        outputs if outputs is not None and usable(outputs) else defaults.outputs)
    return None if named == defaults else named


def output_names(spec: Any, count: int) -> list[str] | None:
    """Each output leaf's path in the returned structure, or None if the spec
    does not describe `count` leaves."""
    if spec is None or spec.num_leaves != count:
        return None
    tree = pytree.tree_unflatten(list(range(count)), spec)
    names = []
    for position, (path, _) in enumerate(pytree.tree_flatten_with_path(tree)[0]):
        parts = [_part(key) for key in path]
        named = any(not isinstance(key, pytree.SequenceKey) for key in path)
        names.append(".".join(parts) if named else f"output_{position}")
    return names


def _part(key: Any) -> str:
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    return str(key).strip("[].")
