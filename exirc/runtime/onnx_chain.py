"""A method's whole chain as one onnxruntime session, when it can be.

A program lowered for XNNPACK is a few delegates with portable kernels
between them (attention's safe-softmax guard, a BERT mask, the embedding
lookups). Run one by one, each delegate pays a session call and each kernel a
torch call: on vit_tiny the five guard kernels between two delegates cost more
than the delegates' own work. `fuse_chain` merges, at load, a method's only
chain into one ONNX model: every delegate running on onnxruntime contributes
its ONNX form (`xnnpack.onnx_engine.OnnxDelegate`), every kernel its
translation (`onnx_chain_ops`), with the method's values as the edges.

It is done only when it is exact and safe, else the method runs as before:
one chain, no jumps, no moves, no program state; every tensor of static
shape; at least one delegate on onnxruntime, every kernel translatable; no
run-time scalar among the arguments, no value written twice, none read
before it is written. The session writes the method's outputs into memory
of its own (a plan may place an output over an input the kernels have
finished reading, which a session need not have), and the per-delegate
sessions are dropped (remade if a run goes kernel by kernel).

At run time `FusedChain.run` (`fused_chain`) reads the checked inputs where
the caller has them (`Method.run` feeds the plan only if the kernels run),
binds again whichever moved since the last run, and runs the session. It
returns False, and the method runs kernel by kernel, whenever the session
cannot be trusted with the call: onnxruntime failed (an index out of range),
an embedding read a negative index (ONNX wraps those; torch raises), or an
input is not laid out row by row. Nothing the session writes is read before
the kernels rewrite it then, and inputs are never written, so the second run
computes (or refuses) exactly as the kernels always did.
Profiled and observed runs always go kernel by kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy
import torch

from exirc.runtime.fused_chain import (
    FLOOR,
    FUSED,
    FusedChain,
    OutputMemory,
    kernel_by_kernel,
    why_no_delegate,
)
from exirc.runtime.kernels import Kernel
from exirc.runtime.onnx_chain_arith import ARITHMETIC
from exirc.runtime.onnx_chain_moves import MOVES
from exirc.runtime.onnx_chain_ops import ONNX_TYPES, TRANSLATORS
from exirc.runtime.onnx_softmax_guard import simplify_bool_reductions
from exirc.runtime.xnnpack.onnx_builder import NotMapped
from exirc.runtime.xnnpack.onnx_engine import OnnxDelegate
from exirc.runtime.xnnpack.onnx_lstm_input import fold_recurrent_input_projections
from exirc.serialize import program as P

OPSET = 20  # as the delegates' ONNX forms (onnx_graph.OPSET)
IR_VERSION = 10
_TRANSLATORS = {**TRANSLATORS, **ARITHMETIC, **MOVES}  # every kernel with an ONNX form


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def fuse_chain(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel],
               backends: Sequence[tuple[Any, Any]], env: list[Any],
               written: frozenset[int], has_state: bool, straight: bool, dynamic: bool
               ) -> tuple[FusedChain | None, str]:
    """The method's chain as one session, or None when it cannot be (module
    docstring); and how plain runs go, in words, with the reason when not fused.
    `straight`: every instruction has fixed arguments and no jumps; `dynamic`: the
    method has tensors of symbolic shape (exirc's shape table says so)."""
    delegates = [handle for _, handle in backends if isinstance(handle, OnnxDelegate)]
    refusal = ("it has more than one chain" if len(plan.chains) != 1 else
               "it has jumps or arguments computed at run time" if not straight else
               "it keeps program state" if has_state else
               "its shapes are dynamic" if dynamic else
               why_no_delegate(backends) if not delegates else "")
    if refusal:
        return None, kernel_by_kernel(refusal)
    try:
        fused = _Builder(plan, env, written).build(plan.chains[0].instructions, kernels,
                                                   backends)
    except NotMapped as reason:
        return None, kernel_by_kernel(str(reason))
    except Exception as error:  # noqa: BLE001 (a chain no translator foresaw: the kernels check it)
        return None, kernel_by_kernel(f"building it failed: {type(error).__name__}: {error}")
    try:
        fused.session()
    except Exception as error:  # noqa: BLE001 (onnxruntime refusing the model: run kernel by kernel)
        return None, kernel_by_kernel(f"onnxruntime refused the fused model: "
                                      f"{type(error).__name__}")
    for delegate in delegates:
        # Their weights would be held twice; a kernel-by-kernel run remakes them.
        delegate.drop_sessions()
    return fused, FUSED


class _Builder:
    """Collects the merged model's nodes while the chain's instructions are translated."""

    def __init__(self, plan: P.ExecutionPlan, env: list[Any], written: frozenset[int]) -> None:
        import onnx.helper
        import onnx.numpy_helper

        self.onnx = onnx
        self.plan, self.env, self.written = plan, env, written
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.produced: set[int] = set()
        self.read: set[int] = set()
        # Written values in order, with their bytes, and where each is read: a
        # plan reuses memory, so a view's bytes and an overwrite are found by address.
        self.position = 0
        self.order: list[tuple[int, int]] = []
        self.spans: dict[int, tuple[int, int]] = {}
        self.uses: list[tuple[int, int]] = []
        self.floors: list[str] = []
        self._counter = 0

    # -- the Emitter interface (onnx_chain_ops) ---------------------------------

    def name(self, value: int) -> str:
        self.tensor(value)
        return f"e{value}"

    def tensor(self, value: int) -> torch.Tensor:
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        tensor = self.env[value] if meta is not None else None
        if not isinstance(meta, P.Tensor) or not isinstance(tensor, torch.Tensor):
            raise NotMapped(f"value {value} is not a tensor")
        if meta.shape_dynamism != P.TensorShapeDynamism.STATIC or \
                tensor.dtype not in ONNX_TYPES or not tensor.is_contiguous():
            raise NotMapped(f"value {value} is dynamic, strided or of an unmapped dtype")
        return tensor

    def scalar(self, value: int) -> Any:
        if value in self.written or not 0 <= value < len(self.env):
            raise NotMapped(f"value {value} changes at run time")
        return self.env[value]

    def items(self, value: int) -> list[int | None] | None:
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        if not isinstance(meta, (P.TensorList, P.OptionalTensorList)):
            return None
        return [None if item == -1 else item for item in meta.items]

    def constant(self, value: int) -> torch.Tensor:
        if not self._is_constant(value):
            raise NotMapped(f"value {value} is not a constant")
        return self.tensor(value)

    def array(self, stem: str, array: numpy.ndarray) -> str:
        self._counter += 1
        name = f"{stem}_{self._counter}"
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def node(self, op_type: str, inputs: list[str], outputs: list[str] | None = None,
             **attributes: Any) -> str:
        if outputs is None:
            self._counter += 1
            outputs = [f"{op_type.lower()}_{self._counter}"]
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, outputs, **attributes))
        return outputs[0]

    def floor(self, indices: str) -> None:
        self.floors.append(self.node("Cast", [indices], to=ONNX_TYPES[torch.int64]))

    def least_index(self) -> None:
        """The output FLOOR: the least of the indices `floor` collected. One ReduceMin
        per index tensor and a Min of them (each node costs a session ~0.5 us)."""
        if len(self.floors) == 1:
            self.node("ReduceMin", self.floors, [FLOOR], keepdims=0)
            return
        least = [self.node("ReduceMin", [indices], keepdims=0) for indices in self.floors]
        self.node("Min", least, [FLOOR])

    # -- building ---------------------------------------------------------------

    def build(self, instructions: list[Any], kernels: Mapping[int, Kernel],
              backends: Sequence[tuple[Any, Any]]) -> FusedChain:
        for position, instr in enumerate(instructions):
            self.position = position
            if isinstance(instr, P.FreeCall):
                continue
            if isinstance(instr, P.DelegateCall):
                handle = backends[instr.delegate_index][1]
                if not isinstance(handle, OnnxDelegate):
                    why = getattr(handle, "not_on_onnxruntime", "") or "not an XNNPACK delegate"
                    raise NotMapped(f"instruction {position}: a delegate runs on torch ({why})")
                self._delegate(position, handle, instr.args)
            elif isinstance(instr, P.KernelCall):
                self._kernel(position, kernels[instr.op_index], instr.args)
            else:
                raise NotMapped(f"instruction {position}: {type(instr).__name__}")
        return self._finish(len(instructions))

    def _kernel(self, position: int, kernel: Kernel, args: list[int]) -> None:
        translate = _TRANSLATORS.get(kernel.name)
        parameters = kernel.schema.arguments
        outs = [i for i, p in enumerate(parameters) if p.is_out]
        # An out-variant call lists its arguments, then its result: the out tensor again.
        if translate is None or len(outs) != 1 or len(args) != len(parameters) + 1 or \
                args[outs[0]] != args[-1]:
            raise NotMapped(f"instruction {position}: {kernel.name} has no ONNX form here")
        for i, value in enumerate(args[:len(parameters)]):
            if i not in outs:
                self._reads(value)
        translate(self, list(args[:len(parameters)]))
        self._writes(args[-1])

    def _delegate(self, position: int, handle: OnnxDelegate, args: list[int]) -> None:
        model = self.onnx.load_model_from_string(handle.model)
        graph = model.graph
        renamed: dict[str, str] = {"": ""}
        for name, external in zip(handle.input_names, handle.inputs):
            value = args[external.arg]
            self._check_dims(value, external.dims)
            self._reads(value)
            renamed[name] = self.name(value)
        for name, external in zip(handle.output_names, handle.outputs):
            value = args[external.arg]
            self._check_dims(value, external.dims)
            renamed[name] = self.name(value)
        prefix = f"d{position}/"

        def rename(name: str) -> str:
            return renamed.get(name, prefix + name)

        for initializer in graph.initializer:
            initializer.name = rename(initializer.name)
            self.initializers.append(initializer)
        for node in graph.node:
            node.input[:] = [rename(n) for n in node.input]
            node.output[:] = [rename(n) for n in node.output]
            node.name = prefix + node.name if node.name else ""
            self.nodes.append(node)
        for external in handle.outputs:
            self._writes(args[external.arg])

    def _check_dims(self, value: int, dims: tuple[int, ...]) -> None:
        tensor = self.tensor(value)
        if tuple(tensor.shape) != tuple(dims) or tensor.dtype != torch.float32:
            raise NotMapped(f"value {value} is {tuple(tensor.shape)}, the delegate's {dims}")

    def _reads(self, value: int) -> None:
        """Note a value the chain reads; `read` keeps those it has not written first."""
        if value in self.written:
            raise NotMapped(f"value {value} changes at run time")
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        if isinstance(meta, (P.TensorList, P.OptionalTensorList)):
            for item in meta.items:  # computed items are read (constants: initializers)
                if item != -1 and not self._is_constant(item):
                    self._reads(item)
            return
        if not isinstance(meta, P.Tensor):
            return  # scalars become attributes or initializers
        if value not in self.produced and meta.allocation_info is not None and \
                value not in self.plan.inputs:
            self._view_of_written(value)
        if value in self.produced:
            self.uses.append((self.position, value))
        else:
            self.read.add(value)

    def _covers(self, source: int, source_span: tuple[int, int], value: int,
                span: tuple[int, int]) -> bool:
        """Whether `source`'s bytes hold all of `value`'s, whole elements of one dtype."""
        itemsize = self.env[source].element_size()
        return source_span[0] <= span[0] < span[1] <= source_span[1] and \
            self.env[source].dtype == self.env[value].dtype and \
            (span[0] - source_span[0]) % itemsize == 0

    def _view(self, value: int, source: int, source_span: tuple[int, int],
              span: tuple[int, int]) -> None:
        """`value` as the elements of `source` at its bytes (both contiguous)."""
        elements = self.name(source)
        if span != source_span:
            itemsize = self.env[source].element_size()
            first = (span[0] - source_span[0]) // itemsize
            flat = self.node("Reshape", [elements, self.array("flat", numpy.asarray(
                [-1], numpy.int64))])
            elements = self.node("Slice", [flat, self.array("start", numpy.asarray(
                [first], numpy.int64)), self.array("end", numpy.asarray(
                    [first + self.env[value].numel()], numpy.int64))])
        self.node("Reshape", [elements, self.array(
            "shape", numpy.asarray(self.env[value].shape, numpy.int64))], [self.name(value)])
        self._writes(value)

    def _is_constant(self, value: int) -> bool:
        meta = self.plan.values[value] if 0 <= value < len(self.plan.values) else None
        return isinstance(meta, P.Tensor) and bool(meta.data_buffer_idx) and \
            meta.allocation_info is None

    def _view_of_written(self, value: int) -> None:
        """A planned value no instruction writes is a view: of the bytes the last write
        to its memory left, or of an input's (when nothing wrote there). Read as a
        Reshape of that value, or of the run of its elements it covers (a select or
        slice of whole rows), in the same dtype (else the chain is not fused)."""
        tensor = self.tensor(value)
        span = _span(tensor)
        for _, source in reversed(self.order):
            source_span = self.spans[source]
            if self._covers(source, source_span, value, span):
                self.uses.append((self.position, source))
                self._view(value, source, source_span, span)
                return
            if source_span[0] < span[1] and span[0] < source_span[1]:
                break
        else:
            for source in dict.fromkeys(self.plan.inputs):
                meta = self.plan.values[source]
                if not isinstance(meta, P.Tensor) or meta.allocation_info is None:
                    continue  # a scalar, or read where the caller has it
                source_span = _span(self.tensor(source))
                if self._covers(source, source_span, value, span):
                    self._reads(source)
                    self._view(value, source, source_span, span)
                    return
        raise NotMapped(f"value {value} is read, but no instruction of the chain wrote it")

    def _writes(self, value: int) -> None:
        if value in self.produced or value in self.plan.inputs:
            raise NotMapped(f"value {value} is written twice")
        self.spans[value] = _span(self.tensor(value))
        self.order.append((self.position, value))
        self.produced.add(value)

    def _check_no_overwrites(self) -> None:
        """Refuse the chain if a value it reads was overwritten in memory since it was
        written: the kernels would read the new bytes, the session the old value."""
        written_at = {value: position for position, value in self.order}
        end = self.position + 1
        uses = self.uses + [(end, v) for v in self.plan.outputs if v in written_at]
        for at, value in uses:
            start, stop = self.spans[value]
            for position, other in self.order:
                if written_at[value] < position < at and other != value:
                    other_start, other_stop = self.spans[other]
                    if other_start < stop and start < other_stop:
                        raise NotMapped(f"value {value} is overwritten by value {other} "
                                        "before it is read")

    def _finish(self, length: int) -> FusedChain:
        helper = self.onnx.helper
        self._check_no_overwrites()
        if self.read & self.produced:
            raise NotMapped(f"values {sorted(self.read & self.produced)} are read before "
                            "the chain writes them")
        method_inputs = [v for v in dict.fromkeys(self.plan.inputs) if v in self.read]
        constants = sorted(self.read - set(self.plan.inputs))
        for value in constants:
            self.constant(value)  # a planned value read before any write: not fusable
        outputs = [v for v in dict.fromkeys(self.plan.outputs) if v in self.produced]
        if not outputs:
            raise NotMapped("the chain writes none of the method's outputs")

        def declare(value: int) -> Any:
            tensor = self.tensor(value)
            return helper.make_tensor_value_info(self.name(value), ONNX_TYPES[tensor.dtype],
                                                 list(tensor.shape))

        graph_outputs = [declare(v) for v in outputs]
        floor = None
        if self.floors:
            self.least_index()
            graph_outputs.append(helper.make_tensor_value_info(FLOOR, ONNX_TYPES[torch.int64], []))
            floor = torch.zeros((), dtype=torch.int64)
        graph = helper.make_graph(self.nodes, "exirc_chain",
                                  [declare(v) for v in method_inputs + constants],
                                  graph_outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="exirc")
        model.ir_version = IR_VERSION
        # The safe-softmax guard in 3 nodes, not 6; the graph is replaced only once done.
        with contextlib.suppress(Exception):
            simplify_bool_reductions(model)
        # A backward LSTM direction's projection, reversed by a flip kernel, folds only here.
        fold_recurrent_input_projections(model)
        return FusedChain(model.SerializeToString(), length,
                          [(self.name(v), _last_position(self.plan.inputs, v))
                           for v in method_inputs],
                          [(self.name(v), self.env[v]) for v in constants],
                          {v: OutputMemory(self.name(v), torch.empty_like(
                              self.env[v], memory_format=torch.contiguous_format))
                           for v in outputs},
                          floor)


def _last_position(inputs: Sequence[int], value: int) -> int:
    """Where `value` is last among the method's inputs: a value listed twice holds
    the later input, as feeding them in order into the plan leaves it."""
    return len(inputs) - 1 - list(reversed(inputs)).index(value)
