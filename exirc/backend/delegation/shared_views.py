"""A reshape of a partition's input that other partitions read is remade in each.

A decoder's RoPE tables are gathered once, outside the delegates, and viewed
(`unsqueeze(1)`) for the attention of every layer. The first layer's partition
takes the view, so it handed the viewed table on to the next layer's partition
as an output of its own: one more reshape node there, one more delegate output
(a planned buffer and a copy), and the reader reshaped it once again. The view
costs nothing to remake where it is read: the reader's partition takes the
table it views instead, and reshapes it once, as it did the view.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from exirc.backend.delegation.interface import Partition, nodes_in_order

# Pure reshapes of their first argument: remaking one changes no value.
_RESHAPES = frozenset({torch.ops.aten.view_copy, torch.ops.aten.unsqueeze_copy,
                       torch.ops.aten.squeeze_copy})


def remake_shared_views(partitions: list[Partition]) -> int:
    """Backend -> Backend, before partitions are cut out: a reshape in one
    partition whose tensor comes from outside it, read by another partition
    of the same backend, gets a copy in that partition (reading the same
    tensor); the first keeps it only if something else still reads it there
    (a partition left empty is dropped). Returns how many copies were made."""
    where = {node: partition for partition in partitions for node in partition.nodes}
    made = 0
    for partition in partitions:
        for view in list(partition.nodes):
            if not _shared_reshape(view, partition, where):
                continue
            readers: dict[int, list[Node]] = {}
            for user in view.users:
                other = where.get(user)
                if other is not None and other is not partition \
                        and other.backend_id == partition.backend_id:
                    readers.setdefault(id(other), []).append(user)
            for users in readers.values():
                other = where[users[0]]
                with view.graph.inserting_after(view):
                    copy = view.graph.node_copy(view)
                for user in users:
                    user.replace_input_with(view, copy)
                other.nodes = nodes_in_order([*other.nodes, copy])
                where[copy] = other
                made += 1
            if not view.users:
                partition.nodes.remove(view)
                del where[view]
                view.graph.erase_node(view)
    partitions[:] = [p for p in partitions if p.nodes]  # one that only passed a view on
    return made


def _shared_reshape(view: Node, partition: Partition, where: dict[Node, Partition]) -> bool:
    packet = getattr(view.target, "overloadpacket", None)
    if view.op != "call_function" or packet not in _RESHAPES:
        return False
    source = view.args[0]
    return isinstance(source, Node) and where.get(source) is not partition
