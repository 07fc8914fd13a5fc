"""A method's whole chain as one ONNX model (`ChainForm`), when it can be.

A program lowered for XNNPACK is a few delegates with portable kernels
between them (attention's safe-softmax guard, a BERT mask, the embedding
lookups). Run one by one, each delegate pays a session call and each kernel a
torch call: on vit_tiny the five guard kernels between two delegates cost more
than the delegates' own work. `chain_form` merges, at load, a method's only
chain into one ONNX model: every delegate an engine runs from its ONNX form
contributes that form (`delegate_form.DelegateForm`), every kernel its
translation (`chain_ops`), with the method's values as the edges. An engine
(onnxruntime, LiteRT) then runs the model as the method.

A chain of kernels alone (a portable program of elementwise and data-moving
ops: masks, position ids, integer preprocessing) is one session too when each
kernel translates bit for bit and there are enough of them to repay the
session call: 1,000 float32 adds take about 0.3 us each in one session
against 1.1-2.7 us as torch calls. With a delegate the chain already rounds as
onnxruntime does, so translations that sum in another order (LayerNorm,
means, log-softmax) are taken there only.

It is done only when it is exact and safe, else the method runs as before:
one chain, no jumps, no moves, no program state; every tensor of static
shape; every delegate with an ONNX form, or only exact kernels; every kernel
translatable or folded at load (`chain_folding`); no run-time scalar among
the arguments, no value written twice, none read before it is written. The
model writes the method's outputs into memory of its own (a plan may place an
output over an input the kernels have finished reading, which an engine need
not have); the per-delegate engines are released (remade if a run goes kernel
by kernel).

At run time (`chain_form.FusedMethod`) the engine reads the checked inputs
where the caller has them (`Method.run` feeds the plan only if the kernels
run). It hands the call back, and the method runs kernel by kernel, whenever
it cannot be trusted with it: the engine failed (an index out of range), an
embedding read a negative index (ONNX wraps those; torch raises), or an input
is not laid out row by row. Nothing the engine writes is read before the
kernels rewrite it then, and inputs are never written, so the second run
computes (or refuses) exactly as the kernels always did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy
import torch

from exirc.runtime.engines.onnx_form.builder import NotMapped
from exirc.runtime.engines.onnx_form.chain_arith import ARITHMETIC
from exirc.runtime.engines.onnx_form.chain_folding import FOLD_LIMIT_BYTES, foldable
from exirc.runtime.engines.onnx_form.chain_form import FLOOR, ChainForm, OutputMemory
from exirc.runtime.engines.onnx_form.chain_moves import MOVES
from exirc.runtime.engines.onnx_form.chain_norms import NORMS
from exirc.runtime.engines.onnx_form.chain_ops import ONNX_TYPES, TRANSLATORS
from exirc.runtime.engines.onnx_form.chain_values import ChainValues
from exirc.runtime.engines.onnx_form.delegate_form import DelegateForm
from exirc.runtime.engines.onnx_form.rules import CHAIN_RULES, apply_rules
from exirc.runtime.kernels.registry import Kernel
from exirc.serialize import program as P

if TYPE_CHECKING:
    from exirc.runtime.engines.seam import MethodView

OPSET = 20  # as the delegates' ONNX forms (xnnpack_graph.OPSET)
IR_VERSION = 10
_TRANSLATORS = {**TRANSLATORS, **ARITHMETIC, **MOVES, **NORMS}  # every kernel with an ONNX form
# Translations that sum in onnxruntime's order, not torch's: fused only among delegates,
# whose nodes do so already (a chain of kernels alone is fused only if bit for bit).
_INEXACT = frozenset({"aten::_log_softmax.out", "aten::native_layer_norm.out",
                      "aten::mean.out", "aten::sum.IntList_out", "aten::mm.out",
                      "aten::bmm.out"})
# A session call costs about 6 us (binding, the call, the outputs' views), a tiny
# kernel call about 1.2 us: below this many kernels a chain alone runs faster as is.
KERNELS_WORTH_A_SESSION = 4


def chain_form(view: MethodView) -> ChainForm | str:
    """The method's chain as one ONNX model, or why it cannot be (module
    docstring). Built once per load: engines that run it share it (`view.shared`)."""
    if _SHARED_KEY not in view.shared:
        view.shared[_SHARED_KEY] = _build(view)
    built: ChainForm | str = view.shared[_SHARED_KEY]
    return built


_SHARED_KEY = "onnx_form.chain"


def _build(view: MethodView) -> ChainForm | str:
    plan = view.plan
    forms = [getattr(handle, "onnx_form", None) for _, handle in view.backends]
    refusal = ("it has more than one chain" if len(plan.chains) != 1 else
               "it has jumps or arguments computed at run time" if not view.straight else
               "it keeps program state" if view.has_state else
               "its shapes are dynamic" if view.dynamic else
               _why_no_delegate_form(view, forms) if view.backends else
               _why_not_kernels_only(plan, view.kernels))
    if refusal:
        return refusal
    try:
        builder = _Builder(plan, view.env, view.written, view.steps[0] if view.steps else None)
        return builder.build(plan.chains[0].instructions, view.kernels, forms)
    except NotMapped as reason:
        return str(reason)
    except Exception as error:  # noqa: BLE001 (a chain no translator foresaw: the kernels check it)
        return f"building it failed: {type(error).__name__}: {error}"


def _why_no_delegate_form(view: MethodView, forms: list[DelegateForm | None]) -> str:
    """Why some delegate has no ONNX form to take in ("" if each has one)."""
    for choice, form in zip(view.delegates, forms):
        if not isinstance(form, DelegateForm):
            reasons = [r.reason for r in choice.refusals]
            why = f": {reasons[0]}" if reasons else ""
            return f"its XNNPACK delegates run on the reference interpreter{why}"
    return ""


def _why_not_kernels_only(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel]) -> str:
    """Why a chain of kernels alone is not one model ("" if it can be): each kernel
    must translate bit for bit (no delegate's rounding is there to hide a sum in
    another order), and there must be enough of them to repay an engine's call."""
    # Counted, not listed (a list of a hundred thousand calls would cost more
    # than the file), and only until both answers are known.
    calls, first_refusal = 0, ""
    for position, instr in enumerate(plan.chains[0].instructions):
        if not isinstance(instr, P.KernelCall):
            continue
        calls += 1
        if not first_refusal:
            first_refusal = _refusal(position, kernels[instr.op_index].name)
        elif calls >= KERNELS_WORTH_A_SESSION:
            break
    if calls < KERNELS_WORTH_A_SESSION:
        return (f"no delegate, and {calls} kernel call{'' if calls == 1 else 's'}: "
                f"fewer than {KERNELS_WORTH_A_SESSION} cost less than a session call")
    return first_refusal


def _refusal(position: int, name: str) -> str:
    """Why the kernel call at `position` keeps its chain off onnxruntime ("" if not)."""
    if name not in _TRANSLATORS:
        return f"instruction {position}: {name} has no ONNX form here"
    if name in _INEXACT:
        return f"instruction {position}: {name} would round otherwise on onnxruntime"
    return ""


class _Builder(ChainValues):
    """Collects the merged model's nodes while the chain's instructions are translated."""

    def __init__(self, plan: P.ExecutionPlan, env: list[Any], written: frozenset[int],
                 steps: Sequence[Callable[[], Any]] | None) -> None:
        import onnx

        super().__init__(plan, env, written)
        self.steps = steps
        self.onnx = onnx
        self.floors: list[str] = []

    # -- the rest of the Emitter interface (onnx_chain_ops) ----------------------

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
              forms: Sequence[DelegateForm | None]) -> ChainForm:
        for position, instr in enumerate(instructions):
            self.position = position
            if isinstance(instr, P.FreeCall):
                continue
            if isinstance(instr, P.DelegateCall):
                form = forms[instr.delegate_index]
                if form is None:
                    raise NotMapped(f"instruction {position}: a delegate has no ONNX form")
                self._delegate(position, form, instr.args)
            elif isinstance(instr, P.KernelCall):
                self._kernel(position, kernels[instr.op_index], list(instr.args))
            else:
                raise NotMapped(f"instruction {position}: {type(instr).__name__}")
        return self._finish(len(instructions))

    def _kernel(self, position: int, kernel: Kernel, args: list[int]) -> None:
        translate = _TRANSLATORS.get(kernel.name)
        parameters = kernel.schema.arguments
        outs = [i for i, p in enumerate(parameters) if p.is_out]
        written = self._results(outs, args, len(parameters))
        if written is not None and self._fold(position, kernel, args[:len(parameters)], outs,
                                              written):
            return
        if translate is None or written is None:
            raise NotMapped(f"instruction {position}: {kernel.name} has no ONNX form here")
        for i, value in enumerate(args[:len(parameters)]):
            if i not in outs:
                self._reads(value)
        translate(self, list(args[:len(parameters)]))
        for value in written:
            self._writes(value)

    def _fold(self, position: int, kernel: Kernel, args: list[int], outs: list[int],
              written: list[int]) -> bool:
        """Run the kernel at load and take its outs as constants, if it reads only
        constants and is worth it (`chain_folding`); whether it was. NotMapped if
        it fails."""
        if self.steps is None or not foldable(kernel) or \
                not all(self._known(value) for i, value in enumerate(args) if i not in outs):
            return False
        tensors = [self.tensor(value) for value in written]
        if sum(t.numel() * t.element_size() for t in tensors) > FOLD_LIMIT_BYTES or \
                any(t.dtype not in ONNX_TYPES for t in tensors):
            return False
        try:
            self.steps[position]()
            arrays = [t.clone().numpy() for t in tensors]
        except Exception as error:  # noqa: BLE001 (recorded: the chain's refusal)
            # Its arguments are the same every run, so it fails every run: run one by
            # one, the kernels raise it (a translation of it might answer instead).
            lines = str(error).strip().splitlines()
            raise NotMapped(f"instruction {position}: {kernel.name} fails on its constant "
                            f"arguments ({type(error).__name__}: {lines[0] if lines else ''})"
                            ) from error
        for value, array in zip(written, arrays):
            self.folded[value] = torch.from_numpy(array)
            self.node("Identity", [self.array("folded", array)], [self.name(value)])
            self._writes(value)
        return True

    def _results(self, outs: list[int], args: list[int], count: int) -> list[int] | None:
        """The tensors an out-variant call writes, or None when its arguments are not
        laid out as one: its `count` arguments, then its result, which is the out
        tensor again, or a list of the outs (several outs, or one list out)."""
        if not outs or len(args) != count + 1:
            return None
        written: list[int] = []
        for i in outs:
            items = self.items(args[i])
            if items is not None and None in items:
                return None  # an optional out left empty
            written += [args[i]] if items is None else [item for item in items if item is not None]
        result = args[-1]
        if len(outs) == 1 and result == args[outs[0]]:
            return written
        return written if self.items(result) == written else None

    def _delegate(self, position: int, handle: DelegateForm, args: list[int]) -> None:
        model = self.onnx.load_model_from_string(handle.model)
        graph = model.graph
        prefix = f"d{position}/"
        renamed: dict[str, str] = {"": ""}
        reshaped: list[tuple[str, int]] = []  # outputs the delegate writes in other dims
        for name, external in zip(handle.input_names, handle.inputs):
            value = args[external.arg]
            self._reads(value)
            renamed[name] = self.name(value)
            if self._in_other_dims(value, external.dims):
                renamed[name] = self.node("Reshape", [self.name(value), self.array(
                    "dims", numpy.asarray(external.dims, numpy.int64))])
        for name, external in zip(handle.output_names, handle.outputs):
            value = args[external.arg]
            if self._in_other_dims(value, external.dims):
                reshaped.append((prefix + name, value))
            else:
                renamed[name] = self.name(value)

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
        for name, value in reshaped:
            self.node("Reshape", [name, self.array("shape", numpy.asarray(
                self.tensor(value).shape, numpy.int64))], [self.name(value)])
        for external in handle.outputs:
            self._writes(args[external.arg])

    def _in_other_dims(self, value: int, dims: tuple[int, ...]) -> bool:
        """Whether the delegate sees float32 `value` as [1] where the plan has it 0-d
        (ExecuTorch binds a 0-d tensor to a delegate's [1]: XNNPACK has no 0-d
        tensors). Any other difference is refused: the reference interpreter
        resizes an output to the delegate's dims, and runs the graph on an
        input's own dims, which a fixed reshape here would not."""
        tensor = self.tensor(value)
        if tensor.dtype != torch.float32:
            raise NotMapped(f"value {value} is {tensor.dtype}, the delegate's float32")
        if tuple(tensor.shape) == tuple(dims):
            return False
        if tensor.dim() == 0 and tuple(dims) == (1,):
            return True
        raise NotMapped(f"value {value} is {tuple(tensor.shape)}, the delegate's {dims}")

    def _finish(self, length: int) -> ChainForm:
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
        self.rules = apply_rules(model, CHAIN_RULES)
        return ChainForm(model.SerializeToString(), length,
                          [(self.name(v), _last_position(self.plan.inputs, v))
                           for v in method_inputs],
                          [(self.name(v), self.env[v]) for v in constants],
                          {v: OutputMemory(self.name(v), torch.empty_like(
                              self.env[v], memory_format=torch.contiguous_format))
                           for v in outputs},
                          floor, self.rules.lines())


def _last_position(inputs: Sequence[int], value: int) -> int:
    """Where `value` is last among the method's inputs: a value listed twice holds
    the later input, as feeding them in order into the plan leaves it."""
    return len(inputs) - 1 - list(reversed(inputs)).index(value)
