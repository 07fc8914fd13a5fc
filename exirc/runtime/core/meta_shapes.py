"""Shapes and dtypes checked at load by running each op on meta tensors.

torch's meta kernels compute what an op would write (sizes, dtypes) from
what it reads, without data, and refuse arguments the real kernel would
refuse (an index of floats, matrices whose sizes do not chain, an out dtype
the result cannot be cast to). At load, each KernelCall whose tensors all
have fixed shapes and whose other arguments are known (not written at run
time) is run once on meta tensors of the sizes, layouts and dtypes the file
declares; the file is refused (`FormatError`) when the meta kernel refuses
the arguments, or computes outs or results of other sizes or dtypes than
the file declares for them. A planned out is exactly the memory the op
writes; one of another size would be resized within the arena (wrong
results) or fail only when it runs.

Not checked (see `_UNCHECKED` and `_stand_in`):
  * ops whose output sizes depend on data (`nonzero`, `masked_select`,
    `unique`, boolean-mask indexing, ...) or that read data (`item`): meta
    kernels cannot know, and most refuse to guess;
  * ops with no meta kernel (torch raises NotImplementedError): nothing to
    compare against;
  * kernels that are not ATen's: the prim ops on scalars, the quantized
    kernels (which check their own arguments as they run), user kernels,
    delegates. A few of exirc's own have an ATen twin checked in their stead
    (`et_view` is `view`, `exirc::addmm_relu.out` is `addmm.out`'s shape), and
    the dim-order copies get their own rule (`dim_order_args`);
  * calls with a dynamic shape or a size computed at run time: their shapes
    are known only when they run, where the arenas bound them.

Results are cached by (operator, argument signature), so the repeated layers
of a model cost one meta call each. The common float ops skip the meta call
when `meta_rules` knows its answer: torch's Python meta kernels import
torch._dynamo and sympy, which would double the time a small program takes
to load.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from exirc.errors import FormatError
from exirc.runtime.core.arenas import TORCH_DTYPES
from exirc.runtime.core.kernel_arguments import CallArguments
from exirc.runtime.core.split_counts import check_count
from exirc.runtime.core.values import Values
from exirc.runtime.kernels import meta_rules
from exirc.runtime.tensor_layout import strides
from exirc.serialize import program as P

_UNCHECKED = frozenset({
    # Output sizes depend on the data.
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
    "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::repeat_interleave",
    "aten::bincount",
    # Read the data itself.
    "aten::_local_scalar_dense", "aten::item", "aten::equal", "aten::is_nonzero",
    "aten::allclose",
})
"""ATen ops (any overload) whose outputs the meta kernels cannot check."""

_STAND_INS = {
    "executorch_prim::et_view.default": "aten::view.default",
    "exirc::addmm_relu.out": "aten::addmm.out",
}
"""exirc's own kernels whose sizes and dtypes are those of an ATen op with the
same arguments: the ATen op's meta kernel checks them."""

_MAY_BE_EMPTY = {
    "aten::_native_batch_norm_legit_no_training.out": frozenset({"out1", "out2"}),
}
"""Outs a file may declare empty where the meta kernel gives them a size: in
inference torch's CPU kernel (and ExecuTorch's) computes no saved mean and
invstd, and ExecuTorch's programs plan them empty."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Outcome = str | list[tuple[tuple[int, ...], torch.dtype] | None]
"""What a meta call found: torch's message if it refused the arguments, else
the sizes and dtype of each out and result (None where it is not a tensor)."""


class MetaShapes:
    """Meta-kernel checks for one method's calls, cached by signature."""

    def __init__(self, values: Values, cache: dict[Any, Outcome | None] | None = None) -> None:
        self._values = values
        self._cache: dict[Any, Outcome | None] = {} if cache is None else cache

    def check(self, call: CallArguments, where: str) -> None:
        """Refuse `call` if its declared outs and results are not what the op makes."""
        op = meta_op(call.kernel.name, call.kernel.schema)
        if op is None or not self._static(call):
            return
        arguments = self._arguments(call)
        if arguments is None or not _bounded(call, arguments, self._values.evalues, where):
            return
        key = (call.kernel.name, _signature(arguments))
        if key not in self._cache:
            self._cache[key] = _outcome(op, call, arguments)
        outcome = self._cache[key]
        if outcome is None:
            return  # no meta kernel, or one that cannot tell
        if isinstance(outcome, str):
            raise FormatError(f"the operator refuses these arguments: {outcome}", field=where)
        self._compare(call, outcome, where)

    def _static(self, call: CallArguments) -> bool:
        """Whether every tensor has a fixed shape and every other argument a fixed value."""
        evalues = self._values.evalues
        written = self._values.written
        for index in call.args[:len(call.kernel.schema.arguments)]:
            value = evalues[index]
            if index in written:
                return False
            if isinstance(value, P.IntList) and any(item in written for item in value.items):
                return False
        tensors = [item for t in call.tensors for _, item in t.tensors()]
        tensors += [slot for _, slot in call.result_pairs(evalues) or ()]
        for index in tensors:
            tensor = evalues[index]
            if isinstance(tensor, P.Tensor) and (
                    tensor.shape_dynamism != P.TensorShapeDynamism.STATIC
                    or tensor.scalar_type not in TORCH_DTYPES):
                return False
        return True

    def _arguments(self, call: CallArguments) -> list[Any] | None:
        """The schema's arguments as meta tensors and plain values; None if one
        cannot be made (a value of a kind the schema does not take: binding says)."""
        evalues, env = self._values.evalues, self._values.env
        found = []
        for arg, index in zip(call.kernel.schema.arguments, call.args):
            value = _meta_value(evalues, env, index, str(arg.real_type))
            if value is _UNUSABLE:
                return None
            found.append(value)
        return found

    def _compare(self, call: CallArguments, outcome: list[Any], where: str) -> None:
        evalues = self._values.evalues
        declared = _declared(call, evalues)
        may_be_empty = _MAY_BE_EMPTY.get(call.kernel.name, frozenset())
        for (label, name, index), made in zip(declared, outcome):
            tensor = evalues[index] if index >= 0 else None  # -1: an optional list's None
            if made is None or not isinstance(tensor, P.Tensor):
                continue
            sizes, dtype = made
            if name in may_be_empty and tensor.numel == 0:
                continue
            if tuple(tensor.sizes) != sizes:
                raise FormatError(f"{label} (value {index}) is declared {_shape(tensor)}, but "
                                  f"the operator makes it {list(sizes)} from these arguments",
                                  field=where)
            if TORCH_DTYPES[tensor.scalar_type] != dtype:
                raise FormatError(f"{label} (value {index}) is declared {_shape(tensor)}, but "
                                  f"the operator makes it {_dtype_name(dtype)}", field=where)


def _bounded(call: CallArguments, arguments: list[Any], evalues: Sequence[P.EValue],
             where: str) -> bool:
    """Whether the meta kernel makes no more tensors than the file names (a
    split's pieces are made before they are counted: `split_counts`)."""
    lists = [t for t in call.tensors if t.written and t.is_list]
    returns = call.kernel.schema.returns
    if not lists and not any(str(ret.real_type) == "List[Tensor]" for ret in returns):
        return True
    if lists:
        declared, label = len(lists[0].items), f"argument {lists[0].name!r}"
    else:
        slots = [evalues[slot] for slot in call.results]
        declared = len(slots[0].items) if len(slots) == 1 and isinstance(
            slots[0], P.TensorList) else len(slots)
        label = "the result"
    return check_count(call.kernel.name, arguments, declared, label, where)


def meta_op(name: str, schema: Any) -> torch._ops.OpOverload | None:
    """The ATen op whose meta kernel checks kernel `name` (None: not checked)."""
    stand_in = _STAND_INS.get(name)
    if stand_in is not None:
        return _aten_op(stand_in)
    if not name.startswith("aten::") or name.rpartition(".")[0] in _UNCHECKED:
        return None
    op = _aten_op(name)
    # A user's kernel registered under an ATen name with a schema of its own
    # is not ATen's op: nothing to check it against.
    if op is None or str(op._schema) != str(schema):
        return None
    return op


def _aten_op(name: str) -> torch._ops.OpOverload | None:
    base, _, overload = name.removeprefix("aten::").partition(".")
    if not (_IDENTIFIER.fullmatch(base) and _IDENTIFIER.fullmatch(overload or "default")):
        return None
    try:
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


# ---------------------------------------------------------------------------
# Meta arguments.
# ---------------------------------------------------------------------------

_UNUSABLE = object()

_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)


def _meta_value(evalues: Sequence[P.EValue], env: list[Any], index: int,
                type_text: str) -> Any:
    """Value `index` as the meta call takes it, or `_UNUSABLE`."""
    evalue = evalues[index]
    base = type_text[9:-1] if type_text.startswith("Optional[") else type_text
    if isinstance(evalue, P.Null):
        return None
    if isinstance(evalue, P.Tensor):
        return _meta_tensor(evalue) if base == "Tensor" else _UNUSABLE
    if isinstance(evalue, (P.TensorList, P.OptionalTensorList)):
        if base not in ("List[Tensor]", "List[Optional[Tensor]]"):
            return _UNUSABLE
        items = [evalues[i] if i >= 0 else P.Null() for i in evalue.items]
        return [_meta_tensor(item) if isinstance(item, P.Tensor) else None for item in items]
    value = env[index]
    if base in ("ScalarType", "MemoryFormat", "Layout") and (
            not isinstance(value, int) or isinstance(value, bool)):
        return _UNUSABLE
    if base == "ScalarType":
        try:
            return TORCH_DTYPES[P.ScalarType(value)]
        except (ValueError, KeyError):
            return _UNUSABLE
    if base == "MemoryFormat":
        return _MEMORY_FORMATS[value] if 0 <= value < len(_MEMORY_FORMATS) else _UNUSABLE
    if base == "Layout":
        return torch.strided if value == 0 else _UNUSABLE
    if base in ("Device", "Generator", "Storage", "Stream"):
        return _UNUSABLE  # never given a value by the programs we run: not ours to guess
    return value


def _meta_tensor(tensor: P.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.sizes, strides(tensor.sizes, tensor.dim_order),
                               dtype=TORCH_DTYPES[tensor.scalar_type], device="meta")


def _signature(arguments: list[Any]) -> tuple[Any, ...]:
    """A hashable key that identifies the arguments as far as a meta kernel sees them."""
    return tuple(_key(value) for value in arguments)


def _key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, list):
        return ("list", tuple(_key(item) for item in value))
    return (type(value).__name__, value)


# ---------------------------------------------------------------------------
# The meta call.
# ---------------------------------------------------------------------------


def _outcome(op: torch._ops.OpOverload, call: CallArguments, arguments: list[Any]
             ) -> Outcome | None:
    """What `op` makes of the meta `arguments` (see `kernel_outcome`); a call
    that `meta_rules` knows the op accepts as declared is not run."""
    if not call.functional and meta_rules.accepts(op.name(), arguments):
        return [_made(arguments[-1])]
    return kernel_outcome(op, call.kernel.schema, call.functional, arguments)


def kernel_outcome(op: torch._ops.OpOverload, schema: Any, functional: bool,
                   arguments: list[Any]) -> Outcome | None:
    """Run `op`'s meta kernel on `arguments` (laid out as `schema` says): torch's
    message if it refuses them, the outs' and results' sizes and dtypes if not,
    None if it cannot tell."""
    positional, keywords = [], {}
    for arg, value in zip(schema.arguments, arguments):
        if arg.kwarg_only:
            keywords[arg.name] = value
        else:
            positional.append(value)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "an output with one or more elements was resized"
            result = op(*positional, **keywords)
    except (NotImplementedError, TypeError):
        return None  # no meta kernel; or arguments torch cannot take at all (binding says)
    except Exception as error:  # noqa: BLE001 (whatever a meta kernel raises: it refused)
        message = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "meta" in message.lower():
            return None  # a kernel that needs the data ("cannot be called on meta tensors")
        return message
    made: list[Any] = []
    for arg, value in zip(schema.arguments, arguments):
        if arg.alias_info is not None and arg.alias_info.is_write and value is not None:
            for tensor in value if isinstance(value, list) else [value]:
                made.append(_made(tensor))
    if functional:
        results = list(result) if isinstance(result, (tuple, list)) and \
            len(schema.returns) > 1 else [result]
        made.extend(_made(item) for item in results)
    return made


def _made(value: Any) -> tuple[tuple[int, ...], torch.dtype] | None:
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(value.shape), value.dtype


def _declared(call: CallArguments, evalues: Sequence[P.EValue]) -> list[tuple[str, str, int]]:
    """(label, argument name, value) of each out and result, in the order
    `_outcome` lists them."""
    declared = []
    for t in call.tensors:
        if t.written:
            declared += [(t.label(position), t.name, item)
                         for position, item in enumerate(t.items)]
    if call.functional:
        pairs = call.result_pairs(evalues) or []
        declared += [(f"result {i}", "", slot) for i, (_, slot) in enumerate(pairs)]
    return declared


def _shape(tensor: P.Tensor) -> str:
    return f"{_dtype_name(TORCH_DTYPES[tensor.scalar_type])}{list(tensor.sizes)}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
