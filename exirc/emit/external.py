"""The program's weights -> an external data file (`exirc compile --external-weights`).

Program model -> program model: every constant tensor (not program state,
whose initial value stays in the program as ExecuTorch keeps it) becomes
`location EXTERNAL` with a name, and its bytes an entry of a `DataFile`
under that name with the tensor's layout, which a loader checks before use.
Delegates' named data (an XNNPACK payload's weights) goes to the same file
(`exirc.emit.delegates.attach`), as ExecuTorch's exporter puts it there.

Names are the weights' fully qualified names (`layers.0.attention.wq.weight`)
or what a folded constant was made from, as the program's constant names
report them, so they stay the same from one compile to the next: two
programs compiled from one model read one data file. A buffer read as two
different tensors (equal bytes, another dtype or shape) gets a name per
tensor, the second and later with a `#N` suffix, since the layout is part
of what a name promises.
"""

from __future__ import annotations

from exirc.emit.constants import ConstantTable
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile, TensorLayout


def move_weights(program: P.Program, constants: ConstantTable) -> DataFile:
    """Make each constant tensor of `program` external; the data file holding them.

    Run before `constants.attach`: the constants then leave the program."""
    data = DataFile()
    named: dict[tuple[int, TensorLayout], str] = {}
    position: dict[str, int] = {}
    for plan in program.execution_plan:
        for value in plan.values:
            if not isinstance(value, P.Tensor) or not value.data_buffer_idx \
                    or value.allocation_info is not None:
                continue
            layout = TensorLayout.of(value)
            key = named.get((value.data_buffer_idx, layout))
            if key is None:
                key = _free_name(_name(constants, value.data_buffer_idx), data)
                named[(value.data_buffer_idx, layout)] = key
                position[key] = len(position)
                stored = memoryview(constants.buffers[value.data_buffer_idx])[:layout.nbytes]
                data.add(key, stored, layout)
            value.extra_tensor_info = P.ExtraTensorInfo(
                fully_qualified_name=key, location=P.TensorDataLocation.EXTERNAL)
            # ExecuTorch's exporter numbers a program's external tensors from 0;
            # runtimes find them by name.
            value.data_buffer_idx = position[key]
    constants.drop_constants()
    return data


def _name(constants: ConstantTable, index: int) -> str:
    names = constants.names.get(index)
    return names[0] if names else f"constant_{index}"


def _free_name(name: str, data: DataFile) -> str:
    if name not in data.entries:
        return name
    suffix = 1
    while f"{name}#{suffix}" in data.entries:
        suffix += 1
    return f"{name}#{suffix}"
