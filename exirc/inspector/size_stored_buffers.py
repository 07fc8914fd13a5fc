"""Stored buffers (constants, mutable data) in the size report: which tensor
uses each, and what it is called (which hold the same bytes:
`size_duplicates`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from exirc.inspector.listing import value_type
from exirc.inspector.render import plural
from exirc.inspector.size_constant_names import ConstantUse, NameSource, constant_name
from exirc.inspector.size_ledger import Ledger, RowKey
from exirc.serialize import program as P


class StoredBuffers:
    def __init__(self, program: P.Program, name_sources: Sequence[NameSource]) -> None:
        self.uses = stored_buffer_uses(program)
        self.name_sources = name_sources
        self.methods = len(program.execution_plan)

    def use(self, table: int | None, index: int) -> ConstantUse | None:
        return self.uses.get(table, {}).get(index)

    def tensor_bytes(self, table: int | None, index: int, available: int) -> int:
        """Bytes of a buffer its tensor uses (the rest is padding); all if unused."""
        use = self.use(table, index)
        return available if use is None else min(use.tensor.nbytes, available)

    def declare(self, ledger: Ledger, key: RowKey, group: str, table: int | None,
                index: int) -> RowKey:
        """The row of stored buffer `index` of `table` (None: the constants)."""
        kind = "constant" if table is None else "mutable_data"
        use = self.use(table, index)
        label = f"constant {index}" if table is None else f"mutable data {table}/{index}"
        if use is None:
            return ledger.declare(key, group, f"{label}: not used by any tensor", kind,
                                  buffer=index, table=table)
        name = constant_name(use, self.name_sources)
        tensor_type = value_type(use.tensor)
        where = f" of {use.method}" if self.methods > 1 else ""
        if name:
            item = f"{label}: {name} {tensor_type}"
        else:
            used_by = f" used by {use.user}" if use.user else ""
            item = f"{label}: %{use.value}{where} {tensor_type}{used_by}"
        if use.tensors > 1:
            item += f" (+{plural(use.tensors - 1, 'more tensor')})"
        return ledger.declare(key, group, item, kind, buffer=index, table=table,
                              method=use.method, value=use.value, type=tensor_type, name=name,
                              used_by=use.user, tensors=use.tensors)


def stored_buffer_uses(program: P.Program) -> dict[int | None, dict[int, ConstantUse]]:
    """The first use of each stored buffer: under None the constants by
    data_buffer_idx, under j those of mutable data segment table j."""
    found: dict[int | None, dict[int, ConstantUse]] = {}
    for plan in program.execution_plan:
        stored = [index for index, value in enumerate(plan.values)
                  if isinstance(value, P.Tensor) and value.data_buffer_idx]
        if not stored:
            continue
        users = first_users(plan, frozenset(stored))
        for index in stored:
            value = plan.values[index]
            assert isinstance(value, P.Tensor)
            table: int | None = None
            if value.allocation_info is not None:
                # Planned memory with stored data is mutable state: its
                # initial value lives in a mutable data segment.
                extra = value.extra_tensor_info
                table = extra.mutable_data_segments_idx if extra is not None else 0
            table_uses = found.setdefault(table, {})
            use = table_uses.get(value.data_buffer_idx)
            if use is None:
                table_uses[value.data_buffer_idx] = ConstantUse(plan.name, index, value,
                                                                users.get(index))
            else:
                use.tensors += 1  # e.g. ExecuTorch stores equal parameters once
    return found


def first_users(plan: P.ExecutionPlan, wanted: Collection[int] | None = None) -> dict[int, str]:
    """Value index -> the first operator or delegate whose call uses it (of the
    values in `wanted`, or all). Each tensor list's items are looked at once,
    at its first call, however many calls use it."""
    users: dict[int, str] = {}
    lists_seen: set[int] = set()

    def use(index: int, name: str) -> None:
        if wanted is None or index in wanted:
            users.setdefault(index, name)

    for chain in plan.chains:
        for instr in chain.instructions:
            if isinstance(instr, P.KernelCall):
                name = plan.operators[instr.op_index].qualified_name
            elif isinstance(instr, P.DelegateCall):
                name = f"delegate {plan.delegates[instr.delegate_index].id}"
            else:
                continue
            for index in instr.args:
                use(index, name)
                value = plan.values[index]
                if isinstance(value, (P.TensorList, P.OptionalTensorList)) and \
                        id(value.items) not in lists_seen:
                    lists_seen.add(id(value.items))
                    for item in value.items:
                        if item >= 0:
                            use(item, name)
    return users
