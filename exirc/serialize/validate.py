"""Cross-reference checks on a decoded program.

Decoding proves every table is well formed; this proves every index points
into the table it names and every tensor fits the memory it claims, so the
interpreter and the inspector can index without checking again. Runs on
every file read, ours or not.
"""

from __future__ import annotations

from exirc.errors import FormatError
from exirc.serialize import program as P

# Bytes a planned tensor or arena may claim: beyond any real device, and
# small enough that size arithmetic stays far from overflow.
MAX_TENSOR_BYTES = 1 << 48

# Lists up to this long are checked wherever they are used: cheaper than
# remembering them, and bounded per use.
_SHORT_LIST = 16


def validate_program(program: P.Program) -> None:
    segment_sizes = [len(s.data) for s in program.segments]
    _check_subsegments(program.constant_segment, segment_sizes, "constant_segment")
    for i, sub in enumerate(program.mutable_data_segments):
        _check_subsegments(sub, segment_sizes, f"mutable_data_segments[{i}]")
    for i, named in enumerate(program.named_data):
        _index(named.segment_index, len(segment_sizes), f"named_data[{i}].segment_index",
               "segments")
    constant_sizes = _constant_sizes(program)
    for i, plan in enumerate(program.execution_plan):
        _PlanChecker(program, plan, f"execution_plan[{i}]", constant_sizes).check()


def external(tensor: P.Tensor) -> bool:
    """Whether the tensor's data is in an external data file, found by its name."""
    extra = tensor.extra_tensor_info
    return extra is not None and extra.location == P.TensorDataLocation.EXTERNAL


def _stride_extent(sizes: list[int]) -> int:
    """The product of the sizes with 0 counted as 1: what strides multiply."""
    extent = 1
    for size in sizes:
        extent *= max(size, 1)
        if extent > MAX_TENSOR_BYTES:
            break  # already too large; more digits would only cost time
    return extent


def _shown(sizes: list[int]) -> str:
    """Sizes for a message, cut when there are many."""
    if len(sizes) <= 8:
        return str(list(sizes))
    return f"[{', '.join(map(str, sizes[:8]))}, ... {len(sizes) - 8} more]"


def _index(value: int, length: int, field: str, table: str) -> None:
    if not 0 <= value < length:
        raise FormatError(f"index {value} is out of range: {table} has {length} entries",
                          field=field)


def _check_subsegments(sub: P.SubsegmentOffsets | None, segment_sizes: list[int],
                       field: str) -> None:
    if sub is None or not sub.offsets:
        return
    _index(sub.segment_index, len(segment_sizes), f"{field}.segment_index", "segments")
    size = segment_sizes[sub.segment_index]
    for i, offset in enumerate(sub.offsets):
        if offset > size:
            raise FormatError(f"offset {offset} is past the end of its {size}-byte segment",
                              field=f"{field}.offsets[{i}]")


def _constant_sizes(program: P.Program) -> list[int]:
    """Bytes available to each constant buffer (to the next start or the end)."""
    sub = program.constant_segment
    if sub is not None and sub.offsets:
        size = len(program.segments[sub.segment_index].data)
        spans = (P.constant_span(sub.offsets, i, size) for i in range(len(sub.offsets)))
        return [end - start for start, end in spans]
    return [len(buffer.storage) for buffer in program.constant_buffer]


class _PlanChecker:
    def __init__(self, program: P.Program, plan: P.ExecutionPlan, path: str,
                 constant_sizes: list[int]) -> None:
        self.program = program
        self.plan = plan
        self.path = path
        self.constant_sizes = constant_sizes
        self.num_values = len(plan.values)
        # Long lists already checked, by identity: a file may point many values
        # at one list table (the reader then shares one object), and checking
        # it again per value would cost values x items.
        self.checked_lists: set[int] = set()

    def value(self, index: int, field: str) -> None:
        _index(index, self.num_values, f"{self.path}.{field}", "values")

    def check(self) -> None:
        plan = self.plan
        for i, size in enumerate(plan.non_const_buffer_sizes):
            if size > MAX_TENSOR_BYTES:
                raise FormatError(f"buffer size {size} is implausibly large",
                                  field=f"{self.path}.non_const_buffer_sizes[{i}]")
        for i, index in enumerate(plan.inputs):
            self.value(index, f"inputs[{i}]")
        for i, index in enumerate(plan.outputs):
            self.value(index, f"outputs[{i}]")
        for i, value in enumerate(plan.values):
            self.check_value(value, f"values[{i}]")
        for i, delegate in enumerate(plan.delegates):
            self.check_delegate(delegate, f"delegates[{i}]")
        for i, chain in enumerate(plan.chains):
            self.check_chain(chain, f"chains[{i}]")

    def check_value(self, value: P.EValue, field: str) -> None:
        if isinstance(value, P.Tensor):
            self.check_tensor(value, field)
        elif isinstance(value, P.IntList):
            self.check_items(value.items, (P.Int,), field)
        elif isinstance(value, P.TensorList):
            self.check_items(value.items, (P.Tensor,), field)
        elif isinstance(value, P.OptionalTensorList):
            self.check_items(value.items, (P.Tensor, P.Null), field)

    def check_items(self, items: list[int], kinds: tuple[type, ...], field: str) -> None:
        """List items are value indices; each must name a value of `kinds`."""
        if len(items) > _SHORT_LIST:
            if id(items) in self.checked_lists:
                return
            self.checked_lists.add(id(items))
        names = " or ".join(kind.__name__ for kind in kinds)
        for j, index in enumerate(items):
            if index == -1 and P.Null in kinds:
                continue  # an optional list's None
            self.value(index, f"{field}.items[{j}]")
            found = self.plan.values[index]
            if not isinstance(found, kinds):
                raise FormatError(f"item refers to value {index}, a {type(found).__name__}, "
                                  f"where a {names} is required",
                                  field=f"{self.path}.{field}.items[{j}]")

    def check_tensor(self, tensor: P.Tensor, field: str) -> None:
        path = f"{self.path}.{field}"
        # Bounded before `nbytes` multiplies the sizes out. A size-0 dim makes
        # the tensor empty whatever the others are, but strides still multiply
        # them: they too must stay far within int64 arithmetic.
        extent = _stride_extent(tensor.sizes) * tensor.scalar_type.itemsize
        if extent > MAX_TENSOR_BYTES:
            why = "is empty, but its other dims span" if 0 in tensor.sizes else "needs"
            raise FormatError(f"tensor of sizes {_shown(tensor.sizes)} {why} more than "
                              f"2**48 bytes, implausibly many", field=f"{path}.sizes")
        nbytes = tensor.nbytes
        if tensor.data_buffer_idx and tensor.allocation_info is not None:
            # A planned tensor with data is mutable state: its initial value
            # is in a mutable data segment, not among the constants.
            extra = tensor.extra_tensor_info
            segment = extra.mutable_data_segments_idx if extra is not None else 0
            _index(segment, len(self.program.mutable_data_segments),
                   f"{path}.extra_tensor_info.mutable_data_segments_idx", "mutable_data_segments")
            _index(tensor.data_buffer_idx,
                   len(self.program.mutable_data_segments[segment].offsets),
                   f"{path}.data_buffer_idx", "mutable data offsets")
        elif tensor.data_buffer_idx and not external(tensor):
            # (an external tensor's index counts the data file's tensors, as ExecuTorch
            # writes it; its bytes are checked against the data file at load)
            _index(tensor.data_buffer_idx, len(self.constant_sizes),
                   f"{path}.data_buffer_idx", "constant buffers")
            available = self.constant_sizes[tensor.data_buffer_idx]
            if nbytes > available:
                raise FormatError(f"constant tensor needs {nbytes} bytes but its buffer has "
                                  f"{available}", field=f"{path}.sizes")
        info = tensor.allocation_info
        if info is not None:
            sizes = self.plan.non_const_buffer_sizes
            _index(info.memory_id, len(sizes), f"{path}.allocation_info.memory_id",
                   "non_const_buffer_sizes")
            if info.offset + nbytes > sizes[info.memory_id]:
                raise FormatError(
                    f"tensor at offset {info.offset} with {nbytes} bytes overruns buffer "
                    f"{info.memory_id} of {sizes[info.memory_id]} bytes",
                    field=f"{path}.allocation_info")

    def check_delegate(self, delegate: P.BackendDelegate, field: str) -> None:
        ref = delegate.processed
        if ref.location == P.DataLocation.INLINE:
            count, table = len(self.program.backend_delegate_data), "backend_delegate_data"
        else:
            count, table = len(self.program.segments), "segments"
        _index(ref.index, count, f"{self.path}.{field}.processed.index", table)

    def check_chain(self, chain: P.Chain, field: str) -> None:
        for i, index in enumerate(chain.inputs):
            self.value(index, f"{field}.inputs[{i}]")
        for i, index in enumerate(chain.outputs):
            self.value(index, f"{field}.outputs[{i}]")
        count = len(chain.instructions)
        if chain.stacktrace and len(chain.stacktrace) != count:
            raise FormatError(f"{len(chain.stacktrace)} stack traces for {count} instructions",
                              field=f"{self.path}.{field}.stacktrace")
        for i, instr in enumerate(chain.instructions):
            self.check_instruction(instr, count, f"{field}.instructions[{i}]")

    def check_instruction(self, instr: P.Instruction, count: int, field: str) -> None:
        path = f"{self.path}.{field}"
        if isinstance(instr, P.KernelCall):
            _index(instr.op_index, len(self.plan.operators), f"{path}.op_index", "operators")
            for j, index in enumerate(instr.args):
                self.value(index, f"{field}.args[{j}]")
        elif isinstance(instr, P.DelegateCall):
            _index(instr.delegate_index, len(self.plan.delegates), f"{path}.delegate_index",
                   "delegates")
            for j, index in enumerate(instr.args):
                self.value(index, f"{field}.args[{j}]")
        elif isinstance(instr, P.MoveCall):
            self.value(instr.move_from, f"{field}.move_from")
            self.value(instr.move_to, f"{field}.move_to")
        elif isinstance(instr, P.JumpFalseCall):
            self.value(instr.cond_value_index, f"{field}.cond_value_index")
            # Jumping to `count` ends the chain; backward jumps are loops,
            # which the interpreter bounds by a step limit.
            if not 0 <= instr.destination_instruction <= count:
                raise FormatError(
                    f"jump to {instr.destination_instruction} is outside the chain's "
                    f"{count} instructions", field=f"{path}.destination_instruction")
        else:
            self.value(instr.value_index, f"{field}.value_index")
