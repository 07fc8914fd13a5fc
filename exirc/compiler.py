"""The compiler: a PyTorch model -> a `.pte` program.

`compile_methods` is the table of contents of the pipeline, a line a stage.
`compile_module` and `compile_model` (what `exirc compile` calls) capture
the model first, and with `verify` / `bundle` check the program against
eager PyTorch and store test cases in it (`exirc.diagnostics`). Heavy
imports happen inside the functions so importing `exirc.compiler` stays
cheap.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exirc.compile_result import CompileReport, CompileResult, StageTimes
from exirc.diagnostics.load_check import check_loadable
from exirc.diagnostics.self_check import check_options, eager_references, verify_and_bundle
from exirc.passes.runner import Instrumentation, Verifier, run_pipeline
from exirc.serialize import program as P
from exirc.targets import DEFAULT_TARGET

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from exirc.backend.ops import BackendOp
    from exirc.capture import MethodSource
    from exirc.runtime.kernels.registry import KernelRegistry


@dataclass(frozen=True)
class CompileOptions:
    target: str = DEFAULT_TARGET
    pipeline: str | Path | None = None  # a YAML file replacing the target's default
    print_ir_after_all: bool = False
    dump_dir: Path | None = None
    verify_stages: bool = True
    print_ir_after_change: bool = False  # the graph after each pass that changed it
    print_ir_diff: bool = False  # a unified diff for each pass that changed the graph
    max_arena_bytes: int | None = None  # fail when a method's planned arena is bigger
    # Run the program and eager PyTorch on the example inputs (or on each .npz of
    # `verify_inputs`) and fail with VerificationError when they differ.
    verify: bool = False
    verify_inputs: tuple[str | Path, ...] = ()
    rtol: float | None = None  # None: by the dtype compared (exirc.diagnostics.tolerance)
    atol: float | None = None
    bundle: bool = False  # store those inputs and eager outputs in the program
    # Quantize before compiling (`exirc.quantize.MODES`), calibrated on the .npz
    # files (or the example inputs); group_size is the weight-only modes' scale groups.
    quantize: str | None = None
    calibration_inputs: tuple[str | Path, ...] = ()
    quantize_group_size: int | None = None
    quantize_embeddings: str | None = None  # "int8"/"int4"/"none"; None: the mode's default
    # Warn for an output whose SQNR against the float model (on `verify_inputs`
    # when given, else the calibration inputs) is below this; None: 20 dB.
    min_sqnr_db: float | None = None
    # Told each stage's name and seconds as it finishes (`exirc compile`'s
    # progress lines); per method for the pipeline's stages.
    on_stage: Callable[[str, float], None] | None = None
    # Where the weights go, if not into the program: an external data file (.ptd)
    # that `CompileResult.save` writes beside it (`exirc.emit.external`).
    external_weights: str | Path | None = None

    @property
    def self_check(self) -> bool:
        """Whether the compile runs the model eagerly: to verify, or to bundle."""
        return self.verify or self.bundle


def _verifiers(target: str, kernels: frozenset[str] = frozenset()) -> dict[str, Verifier]:
    """Each stage's verifier, with the target's kernel checks. `kernels` names
    operators with a registered kernel (a --plugin's) beyond the target's, so ops
    only a plugin runs (custom ops) pass."""
    from exirc.aten.verify import verify_aten
    from exirc.backend.verify import verify_backend
    from exirc.edge.verify import verify_edge
    from exirc.plan.kernels import check_kept_operators
    from exirc.plan.verify import verify_plan

    def verify_edge_on_target(program: ExportedProgram) -> None:
        verify_edge(program, check_kept_operators(program.graph_module, target, kernels))

    def verify_backend_on_target(program: ExportedProgram) -> None:
        verify_backend(program, check_kept_operators(program.graph_module, target, kernels))

    def verify_plan_on_target(program: ExportedProgram) -> None:
        verify_plan(program, target, kernels)  # the final plan, after every plan pass

    return {"aten": verify_aten, "edge": verify_edge_on_target,
            "backend": verify_backend_on_target, "plan": verify_plan_on_target}


def compile_methods(methods: dict[str, ExportedProgram],
                    options: CompileOptions = CompileOptions(),
                    kernels: KernelRegistry | None = None,
                    constant_methods: dict[str, Any] | None = None) -> CompileResult:
    """ATen-dialect methods (from torch.export) -> a serialized program, with
    `constant_methods` (name -> value, `exirc.capture.constant_methods`) after them.

    Operators with a kernel in `kernels` (default: exirc.runtime's registry, where
    plugins register) pass the kernel checks as the target's own do."""
    from exirc.emit import emit_methods
    from exirc.ir.state import plan_state
    from exirc.pipelines import load_pipeline
    from exirc.plan.limits import check_arena_limit
    from exirc.serialize.data_file.writer import write_data_file
    from exirc.serialize.writer import serialize

    pipeline = load_pipeline(options.target, options.pipeline)
    plan_state(methods)  # buffers the model updates: program state, not constants
    instrument = Instrumentation(print_ir_after_all=options.print_ir_after_all,
                                 print_ir_after_change=options.print_ir_after_change,
                                 print_ir_diff=options.print_ir_diff,
                                 dump_dir=options.dump_dir)
    report = CompileReport(stage_seconds=StageTimes(options.on_stage), instrument=instrument)
    verifiers = _verifiers(pipeline.target, _registered(kernels)) \
        if options.verify_stages else {}
    planned = {}
    for name, exported in methods.items():
        # aten -> edge -> backend -> plan, each stage's verifier after it
        planned[name] = run_pipeline(exported, pipeline, method=name, verifiers=verifiers,
                                     instrument=instrument, stage_seconds=report.stage_seconds)
    # Before emitting: a plan over the budget is a failed compile, and no file.
    check_arena_limit(planned, options.max_arena_bytes)
    started = time.perf_counter()
    emitted = emit_methods(planned, constant_methods or {},  # graphs -> program model
                           external_weights=options.external_weights is not None)
    program = emitted.program
    report.stage_seconds["emit"] = time.perf_counter() - started
    started = time.perf_counter()
    data = serialize(program)                         # program model -> .pte bytes
    external = None if emitted.data_file is None else write_data_file(emitted.data_file)
    report.stage_seconds["serialize"] = time.perf_counter() - started
    started = time.perf_counter()
    check_loadable(data, kernels, external)           # what exirc's loader would refuse
    report.stage_seconds["load_check"] = time.perf_counter() - started
    _fill_report(report, program, planned, len(data))
    _dump_program(instrument, program)
    return CompileResult(program, data, report, planned, emitted.instruction_nodes,
                         external_data=external, external_path=options.external_weights)


def _dump_program(instrument: Instrumentation, program: P.Program) -> None:
    """A --dump-dir ends with what the compile made: the memory plan and the listing."""
    if instrument.dump_dir is None:
        return
    from exirc.inspector.dump_pages import listing_text, memory_plan_page
    from exirc.passes.dump_index import DumpFile

    instrument.add_dump_files([
        (DumpFile("memory plan (as `exirc inspect --memory-plan`)", "memory-plan.html"),
         memory_plan_page(program, title="the compiled program")),
        (DumpFile("final program (as `exirc inspect --show instructions`)", "program.txt"),
         listing_text(program))])


def _registered(kernels: KernelRegistry | None) -> frozenset[str]:
    from exirc.runtime.kernels.registry import KERNELS

    install_backend_kernels()  # ops bound to patterns (a plugin's) run, so they pass the checks
    return (KERNELS if kernels is None else kernels).operator_names()


def _fill_report(report: CompileReport, program: P.Program,
                 planned: dict[str, ExportedProgram], file_bytes: int) -> None:
    for plan in program.execution_plan:
        report.state_bytes = max([report.state_bytes,
                                  *plan.non_const_buffer_sizes[P.FIRST_SHARED_BUFFER:]])
        for chain in plan.chains:
            report.instructions += len(chain.instructions)
            report.kernel_calls += sum(isinstance(i, P.KernelCall) for i in chain.instructions)
    from exirc.ir.meta import memory_plan

    for exported in planned.values():
        memory = memory_plan(exported.graph_module)
        if memory is not None:
            report.arena_bytes += memory.arena_bytes
            report.lower_bound_bytes += memory.lower_bound
    if program.constant_segment is not None and program.segments:
        report.constant_bytes = len(program.segments[program.constant_segment.segment_index].data)
    report.file_bytes = file_bytes


def compile_module(module: torch.nn.Module, example_inputs: tuple[Any, ...], *,
                   dynamic_shapes: Any = None,
                   methods: dict[str, tuple[Any, ...]] | None = None,
                   options: CompileOptions = CompileOptions(),
                   kernels: KernelRegistry | None = None,
                   constant_methods: dict[str, Any] | None = None,
                   warn: Callable[[str], None] | None = None) -> CompileResult:
    """Capture `module` (and extra `methods`: name -> (module, inputs[, shapes])),
    with `constant_methods` (name -> value) as a model file's `constant_methods`.

    `kernels` is the interpreter's kernel registry for `options.verify`; `warn`
    receives warnings (default: `warnings.warn`)."""
    from exirc.capture import MethodSource
    from exirc.capture.constant_methods import read_constant_methods

    check_options(options)
    sources = {"forward": MethodSource("forward", module, tuple(example_inputs),
                                       dynamic_shapes, None, "<module>")}
    for name, entry in (methods or {}).items():
        extra_module, extra_inputs, *shapes = entry
        sources[name] = MethodSource(name, extra_module, tuple(extra_inputs),
                                     shapes[0] if shapes else None, None, "<module>")
    constants = read_constant_methods(constant_methods, "constant_methods", sources)
    return _compile_sources(sources, options, kernels, started=time.perf_counter(),
                            constant_methods=constants, warn=warn)


def compile_model(spec: str, options: CompileOptions = CompileOptions(), *,
                  example_inputs_path: str | None = None,
                  warn: Callable[[str], None] | None = None,
                  kernels: KernelRegistry | None = None) -> CompileResult:
    """Compile what `exirc compile SPEC` names: model.py, model.py:factory, .pt2, ...

    `example_inputs_path` feeds a TorchScript archive; `warn` receives
    warnings such as a model left in training mode. With `options.verify`,
    a program that computes something else than the model raises
    VerificationError; `kernels` is the interpreter's kernel registry for it.
    """
    from exirc.capture import load_model

    check_options(options)
    started = time.perf_counter()  # loading the model counts as capture
    loaded = load_model(spec, example_inputs_path=example_inputs_path, warn=warn)
    return _compile_sources(loaded.methods, options, kernels, started=started,
                            constant_methods=loaded.constant_methods, warn=warn)


def _compile_sources(sources: dict[str, MethodSource], options: CompileOptions,
                     kernels: KernelRegistry | None, *, started: float,
                     constant_methods: dict[str, Any] | None = None,
                     warn: Callable[[str], None] | None = None) -> CompileResult:
    """Capture each method, take the eager references --verify/--bundle need,
    compile, and check the program against them; `started` is when capture began."""
    from exirc.capture import capture
    from exirc.quantize.torchao_ops import without_torchao_ops

    exported = {name: capture(source) for name, source in sources.items()}
    sources, exported = without_torchao_ops(sources, exported)
    capture_seconds = time.perf_counter() - started
    if options.on_stage is not None:
        options.on_stage("capture", capture_seconds)
    quantize_started = time.perf_counter()
    quantized = None
    if options.quantize is not None:
        from exirc.diagnostics.quantization import quantize_with
        quantized = quantize_with(options, sources, exported, warn)
    if quantized is not None:  # the quantized model is what the program is verified against
        sources, exported = quantized.sources, quantized.exported
    quantize_seconds = time.perf_counter() - quantize_started
    if quantized is not None and options.on_stage is not None:
        options.on_stage("quantize", quantize_seconds)
    eager_started = time.perf_counter()
    references = eager_references(sources, exported, options)
    eager_seconds = time.perf_counter() - eager_started
    result = compile_methods(exported, options, kernels, constant_methods)
    first = {"capture": capture_seconds}
    if quantized is not None:
        from exirc.diagnostics.quantization import measure

        first["quantize"] = quantize_seconds
        measure(result, quantized, kernels)  # fills result.quantization, its warnings told
    stages = result.report.stage_seconds  # capture first; kept, with its listener
    ordered = {**first, **stages}
    stages.clear()
    dict.update(stages, ordered)  # (not through __setitem__: told of already)
    if references is not None:
        result.report.stage_seconds["eager"] = eager_seconds
        install_backend_kernels()  # both run the program in-process
        if quantized is not None and options.atol is None:
            # Integer kernels (XNNPACK's) may round differently from the reference's
            # float ops: one quantization step of the outputs is a match.
            options = dataclasses.replace(options, atol=quantized.report.output_step or None)
        verify_and_bundle(result, references, options, kernels)
    return result


# -- kernels for backend ops bound to patterns -----------------------------------

# Per registry: operator key -> the backend op whose kernel was installed there.
_INSTALLED: weakref.WeakKeyDictionary[KernelRegistry, dict[str, BackendOp]] = \
    weakref.WeakKeyDictionary()


def install_backend_kernels(registry: KernelRegistry | None = None) -> None:
    """Give each backend op bound with `exirc.backend.ops.bind_pattern_to_op` a
    kernel in the interpreter's `registry` (default: exirc.runtime's) unless it
    has one: the binding's `out_kernel`, else one that runs the op's pattern and
    copies the result into its out (an op without exactly one out gets none, and
    the runtime reports it missing). A kernel the runtime ships or a user
    registered stays, except that an `out_kernel` replaces it.

    The bridge between the compiler's op registry and the runtime's lives here
    because neither may import the other's. Compiling (its kernel checks,
    `--verify`, `--bundle`) and `exirc run --plugin` call it; Python API users who
    bind their own pattern ops call it before running a program that uses them.
    Calling it again installs only what was bound since; an op bound again
    replaces the kernel installed for its earlier binding."""
    from exirc.backend import ops
    from exirc.runtime.kernels.registry import KERNELS, operator_key

    registry = KERNELS if registry is None else registry
    installed = _INSTALLED.setdefault(registry, {})
    for op in list(ops.REGISTRY.values()):
        key = operator_key(*op.kernel_name)
        earlier = installed.get(key)
        if earlier is op:
            continue
        if (op.out_kernel is None and earlier is None
                and registry.find(*op.kernel_name) is not None):
            continue  # the runtime ships a kernel for it (exirc_ops, prim_ops), or a user
        kernel = op.out_kernel or _pattern_kernel(op)
        if kernel is not None:
            registry.register(str(op._schema), kernel)
            installed[key] = op


def _pattern_kernel(op: BackendOp) -> Callable[..., Any] | None:
    """A kernel running `op`'s pattern into its one out, or None if it has not one."""
    from exirc.runtime.kernels.registry import copy_into

    outs = op.out_names
    if len(outs) != 1:
        return None
    out_name, pattern = outs[0], op.pattern

    def run_pattern(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.pop(out_name)
        copy_into(out, pattern(*args, **kwargs))
        return out
    return run_pattern
