"""Loading a program: map it, check it, resolve what it needs, allocate its memory.

    program = exirc.runtime.load("model.pte")
    outputs = program.run("forward", [x])

`load` is the table of contents. Each stage refuses a bad program with a
typed error before the next one costs anything, so a hostile file fails
before it can make us allocate, and a program that needs an operator nobody
registered, or an ATen operator off the runtime's allowlist
(`exirc.runtime.kernels.allowlist`), fails at load, listing everything that is
missing at once.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from exirc.errors import FormatError, UnsupportedOperatorError, UsageError
from exirc.runtime.core import arenas as memory
from exirc.runtime.core import argument_kinds
from exirc.runtime.core.external_data import open_program_files
from exirc.runtime.core.io_names import name_inputs_and_outputs
from exirc.runtime.core.method import DEFAULT_MAX_STEPS, Method
from exirc.runtime.core.module_paths import name_modules
from exirc.runtime.delegates import registry as delegates
from exirc.runtime.delegates import xnnpack as _xnnpack  # noqa: F401 (registers the XnnpackBackend)
from exirc.runtime.delegates.registry import BACKENDS, Backend, BackendRegistry
from exirc.runtime.engines.policy import EnginePolicy
from exirc.runtime.engines.seam import (
    ENGINE_RUNNER,
    check_policy,
    prepare_delegate,
    write_engine_summary,
)
from exirc.runtime.kernels import prim_ops as _prim_ops  # noqa: F401 (registers the prim op kernels)
from exirc.runtime.kernels.registry import (
    KERNELS,
    Kernel,
    KernelRegistry,
    operator_key,
    outside_allowlist,
)
from exirc.runtime.machine import available_memory
from exirc.serialize import program as P
from exirc.serialize import read_program_file, symbolic_shapes
from exirc.serialize.data_file.reader import DataSource
from exirc.serialize.io_names import stored_io_names
from exirc.serialize.mapped_file import MappedFile, open_mapped
from exirc.serialize.module_paths import stored_module_paths

if TYPE_CHECKING:
    from exirc.runtime.core.profile import Profile

Source = bytes | bytearray | memoryview | str | os.PathLike[str]


class LoadedProgram:
    """A program ready to run: its methods, each with its own working memory,
    and the program state they share (which persists from run to run)."""

    def __init__(self, program: P.Program, methods: dict[str, Method]) -> None:
        self.program = program
        self.methods = methods

    @property
    def method_names(self) -> list[str]:
        return list(self.methods)

    def method(self, name: str) -> Method:
        method = self.methods.get(name)
        if method is None:
            known = ", ".join(self.methods) or "none"
            raise UsageError(f"no method named {name!r} in the program (methods: {known})")
        return method

    def reset_state(self) -> None:
        """Put the program's state (buffers its methods update, e.g. a KV cache)
        back to the initial value stored in the file."""
        for method in self.methods.values():
            method.reset_state()

    @property
    def constant_methods(self) -> dict[str, Any]:
        """name -> value of each constant method (no inputs, no instructions: what
        `to_edge(constant_methods=...)` or a model file's `constant_methods` made)."""
        found = {}
        for plan in self.program.execution_plan:
            if plan.inputs or any(chain.instructions for chain in plan.chains):
                continue
            values = self.methods[plan.name].run([])
            spec = plan.container_meta_type.encoded_out_str if plan.container_meta_type else ""
            found[plan.name] = values if "builtins.list" in spec or len(values) != 1 \
                else values[0]
        return found

    @property
    def has_state(self) -> bool:
        return any(method.has_state for method in self.methods.values())

    def run(self, method: str = "forward", inputs: Sequence[Any] | Mapping[str, Any] = (),
            *, profile: Profile | None = None) -> list[Any]:
        """Run `method` on `inputs` (tensors, arrays or scalars, in order or by name)."""
        return self.method(method).run(inputs, profile=profile)


def load(source: Source, *, data: DataSource | None = None,
         max_memory: int | None = None, max_steps: int = DEFAULT_MAX_STEPS,
         max_seconds: float | None = None,
         kernels: KernelRegistry | None = None,
         backends: BackendRegistry | None = None,
         allow_any_aten: bool = False, engine: str | EnginePolicy | None = None,
         dump_engine: str | os.PathLike[str] | None = None,
         machine_limits: bool = True) -> LoadedProgram:
    """Load a `.pte` program (a path, or its bytes) for running.

    `data` is the external data file (`.ptd`, a path or its bytes) holding the
    weights of a program compiled with them outside itself (`exirc compile
    --external-weights`, or ExecuTorch's external constants); a program that
    reads one needs it (ExternalDataError otherwise), and several programs
    may share one.

    `max_memory` caps the bytes of planned memory (arenas) the program may
    claim; whatever it is, a plan larger than the memory available now is
    refused. `max_steps` bounds the work one run may do (and the CPU time its
    loops may spend; `exirc.runtime.core.method`), `max_seconds`, if given, its
    wall-clock time. `kernels` and `backends` default to the global registries.

    A program's operators must have registered kernels or be ATen operators
    on the runtime's allowlist (the built-in targets' kernel lists); others
    are refused, all named at once. `allow_any_aten=True` runs any ATen
    operator torch has: only for a file you trust, since operators off the
    list may trust what a hostile file gets wrong (an index out of range, an
    inconsistent size), and some crash the process on it.

    `engine` picks what runs the program (`exirc.runtime.engines.policy`):
    "reference" (exirc's interpreter alone), "auto" (the default, or the
    EXIRC_ENGINE variable: optional engines where installed and exact),
    "onnxruntime" or "litert". `dump_engine`: a folder for the models engines
    build and the rules that fired. `machine_limits=False` skips the one check
    that is about this machine rather than the file (the memory available now):
    for the compiler, which checks the file it writes for another device.
    """
    policy = EnginePolicy.resolve(engine, dump_engine)
    check_policy(policy)
    mapped = _map(source) if isinstance(source, (str, os.PathLike)) else None
    program_bytes = mapped.view if mapped is not None else source
    program = read_program_file(program_bytes).program  # checked: every index is in range
    plans = program.execution_plan
    _check_method_names(plans)
    kernel_tables, backend_tables = _resolve(plans, kernels or KERNELS, backends or BACKENDS,
                                             allow_any_aten)
    for i, (plan, table) in enumerate(zip(plans, kernel_tables)):
        argument_kinds.check_calls(plan, table, f"execution_plan[{i}]")  # before any kernel
    _check_memory(plans, max_memory, machine_limits)  # before allocating any of it
    modules = stored_module_paths(program)
    shapes = symbolic_shapes.stored_symbolic_shapes(program)
    stored_names = stored_io_names(program)
    files = open_program_files(program, mapped, data, delegates.named_data_index(program))
    shared = memory.allocate_shared_arenas(plans)
    methods = {}
    for i, plan in enumerate(plans):
        where = f"execution_plan[{i}]"
        handles, choices = [], []
        for j, (delegate, backend) in enumerate(zip(plan.delegates, backend_tables[i])):
            try:
                handle = delegates.initialise(backend, program, delegate,
                                              f"{where}.delegates[{j}]", files.named)
            except FormatError:
                files.explain_missing(f"delegate {j} of method {plan.name!r}")
                raise
            choice = prepare_delegate(policy, delegate.id, handle, f"{plan.name}.delegate{j}")
            handles.append((backend, handle) if choice.handle is None
                           else (ENGINE_RUNNER, choice.handle))
            choices.append(choice)
        method = Method(program, plan, where, kernel_tables[i], handles, max_steps,
                        shapes.get(plan.name), shared, max_seconds=max_seconds,
                        files=files, policy=policy, delegate_choices=choices)
        name_inputs_and_outputs(method, stored_names)
        methods[plan.name] = method
    name_modules(methods, plans, modules)
    if policy.dump_dir is not None:
        write_engine_summary(policy.dump_dir, [
            (m.name, m.execution, m.delegate_engines) for m in methods.values()])
    return LoadedProgram(program, methods)


def _map(path: str | os.PathLike[str]) -> MappedFile:
    """The file, mapped copy-on-write (or copied, if small), with its guard.

    Constants become views of these pages, shared with the page cache and
    never copied. Private (not read-only) pages mean that even a kernel that
    wrongly writes into a constant changes only our copy instead of faulting.
    Each method checks the guard before it runs (see `MappedFile`).
    """
    return open_mapped(path, copy_on_write=True)


def _check_method_names(plans: list[P.ExecutionPlan]) -> None:
    seen = set()
    for i, plan in enumerate(plans):
        if plan.name in seen:
            raise FormatError(f"a second method is named {plan.name!r}",
                              field=f"execution_plan[{i}].name")
        seen.add(plan.name)


def _resolve(plans: list[P.ExecutionPlan], kernels: KernelRegistry, backends: BackendRegistry,
             allow_any_aten: bool) -> tuple[list[dict[int, Kernel]], list[list[Backend]]]:
    """Every operator's kernel and every delegate's backend, or one error naming all missing."""
    kernel_tables: list[dict[int, Kernel]] = []
    backend_tables: list[list[Backend]] = []
    missing_ops: dict[str, Counter[str]] = {}
    refused_ops: dict[str, Counter[str]] = {}  # ATen operators off the allowlist
    missing_backends: list[str] = []
    for plan in plans:
        used = {instr.op_index for chain in plan.chains for instr in chain.instructions
                if isinstance(instr, P.KernelCall)}
        table = {}
        for index in sorted(used):
            op = plan.operators[index]
            kernel = kernels.find(op.name, op.overload, any_aten=allow_any_aten)
            if kernel is None:
                key = operator_key(op.name, op.overload)
                refused = outside_allowlist(op.name, op.overload)
                (refused_ops if refused else missing_ops).setdefault(
                    key, Counter())[plan.name] += 1
            else:
                table[index] = kernel
        kernel_tables.append(table)
        found = []  # parallel to plan.delegates once nothing is missing
        for j, delegate in enumerate(plan.delegates):
            backend = backends.find(delegate.id)
            if backend is None:
                missing_backends.append(f"backend {delegate.id!r} (delegate {j} of method "
                                        f"{plan.name!r})")
            else:
                found.append(backend)
        backend_tables.append(found)
    if missing_ops or refused_ops or missing_backends:
        raise _missing(missing_ops, refused_ops, missing_backends)
    return kernel_tables, backend_tables


def _missing(ops: dict[str, Counter[str]], refused: dict[str, Counter[str]],
             backends: list[str]) -> UnsupportedOperatorError:
    """One error naming every operator and backend the program needs and cannot have."""
    parts = []
    if ops:
        parts.append(f"no kernel for {_operators(ops, 'operator')}")
    if refused:
        parts.append(f"{_operators(refused, 'ATen operator', ' off the runtime allowlist')}")
    if backends:
        parts.append(f"no backend registered for {len(backends)} delegate"
                     f"{'s' if len(backends) > 1 else ''}: " + ", ".join(backends))
    hint = ("register kernels with exirc.runtime.register_kernel and backends with "
            "register_backend, in a module you pass to `exirc run --plugin`")
    if refused:
        hint = ("the allowlisted ATen operators are those ExecuTorch's portable kernels "
                "implement; if you trust the file, `exirc run --allow-any-aten-op` "
                "(load(..., allow_any_aten=True)) runs any ATen operator torch has, "
                "or " + hint)
    return UnsupportedOperatorError("; ".join(parts), hint=hint)


def _operators(ops: dict[str, Counter[str]], noun: str, qualifier: str = "") -> str:
    """`2 operators: a.out (in 'forward'), b.out (in 'forward', 'step')`."""
    names = [f"{name} (in {', '.join(repr(m) for m in methods)})"
             for name, methods in sorted(ops.items())]
    return f"{len(ops)} {noun}{'s' if len(ops) > 1 else ''}{qualifier}: " + ", ".join(names)


def _check_memory(plans: list[P.ExecutionPlan], max_memory: int | None,
                  machine_limits: bool) -> None:
    if max_memory is not None:
        memory.check_arena_sizes(plans, max_memory, "the max_memory limit")
    available = available_memory() if machine_limits else None
    if available is not None:
        memory.check_arena_sizes(plans, available, "the memory available now")
