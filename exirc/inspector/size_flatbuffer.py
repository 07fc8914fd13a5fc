"""The size report's view of the FlatBuffer: its objects visited again, each
charged to the part of the program it belongs to.

The walk reads every table, vector and string `decode_program` reads, in the
same order, but keeps none of what it reads: the leaf tables (a value, an
instruction, a frame list) are decoded and dropped one at a time, so the
report never holds a second copy of the program.
"""

from __future__ import annotations

from collections.abc import Callable

from exirc.inspector.render import plural
from exirc.inspector.size_delegates import DelegateSizes, PayloadRows
from exirc.inspector.size_ledger import Fill, Ledger, RowKey
from exirc.inspector.size_spans import Charger, ChargingRecorder, State
from exirc.inspector.size_stored_buffers import StoredBuffers
from exirc.serialize import decode
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import CheckedBuffer, TableView

PROGRAM_GROUP = "program (FlatBuffer)"

_METHOD_PARTS = ("values", "instructions", "stacktrace", "operators", "delegates",
                 "container_meta_type", "other")
# Fields of a plan charged to their own row; the rest are "other plan tables".
_PLAN_ROWS = ("values", "operators", "delegates", "container_meta_type")


def flatbuffer_fill(ledger: Ledger, program_bytes: memoryview, program: P.Program,
                    stored: StoredBuffers, delegates: DelegateSizes | None = None) -> Fill:
    """The fill of the FlatBuffer's region: rows declared now, in a fixed
    order; bytes charged when the region is filled. Inline XNNPACK payloads
    are charged part by part (`delegates`)."""
    _declare_program_rows(ledger, program)
    for i in range(len(program.constant_buffer)):
        if ledger.full:
            break  # the rest are summed: no need to name them
        stored.declare(ledger, ("stored", "inline", i), PROGRAM_GROUP, None, i)

    def constant(i: int) -> tuple[RowKey, int]:
        """The row of inline constant buffer `i`, and the bytes its tensor uses."""
        used = stored.tensor_bytes(None, i, len(program.constant_buffer[i].storage))
        return ledger.lookup(("stored", "inline", i), "constant"), used

    inline: dict[int, tuple[RowKey, PayloadRows | None]] = {}
    for i in _inline_delegate_data(program):
        ids = sorted({d.id for plan in program.execution_plan for d in plan.delegates
                      if d.processed.location == P.DataLocation.INLINE and d.processed.index == i})
        key = ledger.declare(("inline delegate", i), PROGRAM_GROUP,
                             f"inline delegate data {i}" + (f" ({', '.join(ids)})" if ids else ""),
                             "delegate_data", index=i, delegates=ids)
        payload = delegates.payload(P.DataLocation.INLINE, i) if delegates is not None else None
        rows = None if payload is None or delegates is None else \
            delegates.payload_rows(ledger, payload, PROGRAM_GROUP)
        inline[i] = (key, rows)
    padding = ledger.declare(("flatbuffer padding",), PROGRAM_GROUP,
                             "alignment padding (and unknown fields)", "padding")

    def fill(start: int, end: int) -> None:
        charger = Charger(ledger, start, end)
        rules = _ProgramRules(constant, inline)
        recorder = ChargingRecorder(program_bytes, 0, charger, rules)
        walk_program(recorder)
        charger.rest(padding)
    return fill


def _inline_delegate_data(program: P.Program) -> range:
    return range(len(program.backend_delegate_data))


def _declare_program_rows(ledger: Ledger, program: P.Program) -> None:
    """Declare the FlatBuffer's rows up front, so they list in a fixed order."""
    for i, plan in enumerate(program.execution_plan):
        counts = {
            "values": plural(len(plan.values), "value"),
            "instructions": plural(sum(len(c.instructions) for c in plan.chains),
                                   "instruction"),
            "stacktrace": plural(sum(len(f.items) for c in plan.chains for f in c.stacktrace),
                                 "frame"),
            "operators": plural(len(plan.operators), "operator"),
            "delegates": plural(len(plan.delegates), "delegate"),
        }
        labels = {"stacktrace": "stack traces", "container_meta_type": "input/output specs",
                  "other": "other plan tables"}
        for part in _METHOD_PARTS:
            label = labels.get(part, part)
            item = f"{plan.name}: {label}" + (f" ({counts[part]})" if part in counts else "")
            kind = "plan_other" if part == "other" else part
            ledger.declare(("method", i, part), PROGRAM_GROUP, item, kind, method=plan.name)
    for part, item in (("root", "program root, version, plan list"),
                       ("constants", "constant tables (offsets, inline buffer tables)"),
                       ("segments", "segment, mutable data and named data tables"),
                       ("delegates", "inline delegate data tables")):
        ledger.declare(("tables", part), PROGRAM_GROUP, item, "program_other")


# --------------------------------------------------------------------------
# Which row each object goes to.
# --------------------------------------------------------------------------

# A table's state: (its row, what kind of table it is, a plan or buffer index).
_ROOT: State = (("tables", "root"), "root", None)


def _root_field_row(name: str) -> RowKey:
    if name.startswith("constant_"):
        return ("tables", "constants")
    if name in ("segments", "mutable_data_segments", "named_data"):
        return ("tables", "segments")
    if name == "backend_delegate_data":
        return ("tables", "delegates")
    return ("tables", "root")


def _field_row(state: State, name: str) -> RowKey:
    """The row of field `name` of a table in `state` (a vector, a string, or a
    table with all it holds)."""
    row, kind, index = state
    if kind == "root":
        return ("tables", "root") if name == "execution_plan" else _root_field_row(name)
    if kind == "plan":
        return ("method", index, name if name in _PLAN_ROWS else "other")
    if kind == "chain" and name in ("instructions", "stacktrace"):
        return ("method", index, name)
    return row


class _ProgramRules:
    root = _ROOT

    def __init__(self, constant: Callable[[int], tuple[RowKey, int]],
                 inline: dict[int, tuple[RowKey, PayloadRows | None]]) -> None:
        self.constant = constant
        self.inline = inline
        self._children: dict[tuple[State, str], State] = {}

    def row(self, state: State) -> RowKey:
        return state[0]

    def child(self, state: State, part: str, index: int | None) -> State:
        if state[1] != "root":  # then the index does not matter: one state for all
            found = self._children.get((state, part))
            if found is None:
                found = self._children[(state, part)] = self._child(state, part, index)
            return found
        return self._child(state, part, index)

    def _child(self, state: State, part: str, index: int | None) -> State:
        name = part[1:].partition("(")[0]
        row, kind, plan = state
        if kind == "root" and name == "execution_plan":
            return (("method", index, "other"), "plan", index)
        if kind == "root" and name == "constant_buffer":
            return (("tables", "constants"), "inline_constant", index)
        if kind == "root" and name == "backend_delegate_data":
            return (("tables", "delegates"), "inline_delegate", index)
        if kind == "plan" and name == "chains":
            return (("method", plan, "other"), "chain", plan)
        if kind in ("root", "plan", "chain"):
            return (_field_row(state, name), "fixed", None)
        return (row, "fixed", None)

    def vector(self, state: State, name: str, charger: Charger, length: int, start: int,
               end: int) -> None:
        row, kind, index = state
        field_row = _field_row(state, name)
        charger.charge(length, start, field_row)
        if kind == "inline_constant" and name == "storage":
            key, used = self.constant(index)
            charger.charge(start, start + used, key)  # the slack after it is padding
            return
        if kind == "inline_delegate" and name == "data" and index in self.inline:
            key, payload = self.inline[index]
            if payload is not None and end - start == payload.size:
                payload.charge(charger, start)
            else:
                charger.charge(start, end, key)
            return
        charger.charge(start, end, field_row)


# --------------------------------------------------------------------------
# The walk: what decode_program reads, in its order, keeping nothing.
# --------------------------------------------------------------------------


def walk_program(buf: CheckedBuffer) -> None:
    t = buf.root()
    constant_segment = t.table(5, "constant_segment")
    t.scalar(0, decode.U32, 0, "version")
    for x in t.tables(1, "execution_plan"):
        _walk_plan(x)
    for x in t.tables(2, "constant_buffer"):
        x.vector_span(0, 1, "storage")
    for x in t.tables(3, "backend_delegate_data"):
        x.vector_span(0, 1, "data")
    if constant_segment is not None:
        decode.subsegment_offsets(constant_segment)
    for x in t.tables(6, "mutable_data_segments"):
        decode.subsegment_offsets(x)
    for x in t.tables(7, "named_data"):
        x.string(0, "key")
    decode.segment_ranges(buf)  # the segment table, which decode_program skips


def _walk_plan(t: TableView) -> None:
    meta = t.table(1, "container_meta_type")
    t.vector_span(8, 8, "non_const_buffer_sizes")
    t.string(0, "name")
    if meta is not None:
        meta.string(0, "encoded_inp_str")
        meta.string(1, "encoded_out_str")
    _each(t, 2, "values", _walk_evalue)
    t.vector_span(3, 4, "inputs")
    t.vector_span(4, 4, "outputs")
    for x in t.tables(5, "chains"):
        x.vector_span(0, 4, "inputs")
        x.vector_span(1, 4, "outputs")
        _each(x, 2, "instructions", _walk_instruction)
        _each(x, 3, "stacktrace", decode.frame_list)
    for x in t.tables(6, "operators"):
        x.string(0, "name")
        x.string(1, "overload")
    _each(t, 7, "delegates", decode.delegate)
    for _ in t.tables(9, "non_const_buffer_device"):
        pass  # scalars only


_LIST_ITEM_SIZES = {P.IntList: 8, P.DoubleList: 8, P.BoolList: 1, P.TensorList: 4,
                    P.OptionalTensorList: 4}


def _walk_evalue(t: TableView) -> None:
    """What `decode.evalue` reads, without making a list of a list's items."""
    kind, body = t.union(0, 1, "val", P.KERNEL_TYPES)
    if kind is P.Tensor:
        _walk_tensor(body)
    elif kind is P.String:
        body.string(0, "string_val")
    elif kind in _LIST_ITEM_SIZES:
        body.vector_span(0, _LIST_ITEM_SIZES[kind], "items")


def _walk_tensor(t: TableView) -> None:
    """What `decode.tensor` reads, in its order, without making the tensor: the
    file was read whole before its size report, so what the walk visits is
    known to be well formed (and it is still checked)."""
    t.vector_span(2, 4, "sizes")
    t.vector_span(3, 1, "dim_order")
    t.table(6, "allocation_info")
    extra = t.table(9, "extra_tensor_info")
    if extra is not None:
        extra.string(1, "fully_qualified_name")


def _walk_instruction(t: TableView) -> None:
    """What `decode.instruction` reads, as `_walk_tensor` does for a tensor."""
    kind, body = t.union(0, 1, "instr_args", P.INSTRUCTION_TYPES)
    if kind is P.KernelCall or kind is P.DelegateCall:
        body.vector_span(1, 4, "args")


def _each(t: TableView, slot: int, name: str, read: Callable[[TableView], object]) -> None:
    """Read each table of a vector and drop it; a table the file shares is
    read once (as decoding does)."""
    once = t.buf.once
    for x in t.tables(slot, name):
        once(x, read)
