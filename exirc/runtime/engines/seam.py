"""The one seam between the interpreter and the optional engines.

At load the interpreter offers each delegate (`prepare_delegate`) and then each
method (`prepare_method`) to the engines the policy (`policy.EnginePolicy`)
allows, in `ENGINES` order. An engine answers with something faster that does
exactly the same work, or with a `Refusal` saying why not; the interpreter
runs what no engine took. Engines are imported only here, and only when the
policy lets them run, so a program loaded with `engine="reference"` never
imports onnx, onnxruntime or LiteRT.

    prepare_delegate(policy, backend_id, handle)  ->  DelegateChoice
        handle: the backend's own (exirc's XNNPACK executor on torch); the
        choice's `runner` replaces the backend at the DelegateCall.
    prepare_method(policy, view)                   ->  MethodChoice
        view: what an engine may read of a loaded method (`MethodView`); the
        choice's `accelerated.run(inputs)` returns the outputs, or None when
        the interpreter must run that call itself (the kernels then raise the
        error a bad input deserves).

Every choice carries, in words, which engine runs the method or delegate and
why not the others (`exirc run --profile`, `execution`, `--json`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from exirc.errors import UsageError
from exirc.runtime.engines.policy import ENGINES as ENGINE_NAMES
from exirc.runtime.engines.policy import INSTALL_HINTS, REFERENCE, EnginePolicy

if TYPE_CHECKING:
    from exirc.runtime.kernels.registry import Kernel
    from exirc.serialize import program as P


DISPLAY_NAMES = {"litert": "LiteRT", "onnxruntime": "onnxruntime"}


@dataclass(frozen=True)
class Refusal:
    """Why an engine does not take a method or delegate."""

    engine: str
    reason: str

    def __str__(self) -> str:
        return f"not on {DISPLAY_NAMES.get(self.engine, self.engine)}: {self.reason}"


@dataclass(frozen=True)
class MethodView:
    """What an engine may read of a loaded method (the interpreter's, read-only).

    `backends`: each delegate's (backend, handle) as the interpreter will call
    them, after `prepare_delegate`; `delegates`: each delegate's choice.
    `env`: the value table; `written`: values written at run time; `straight`:
    one chain per instruction list, no jumps, fixed arguments; `dynamic`: some
    tensor has a symbolic shape; `steps`: each chain's prepared instructions (an
    engine may run one at load to fold a constant). `input_positions`,
    `output_values` and `copy_out` say how the interpreter hands out outputs.

    `env` and `steps` are made when an engine first asks for them (`tables`):
    the interpreter makes its value table and steps lazily, and a method no
    engine looks at (the reference policy) should not pay for them at load."""

    name: str
    plan: P.ExecutionPlan
    kernels: Mapping[int, Kernel]
    backends: Sequence[tuple[Any, Any]]
    delegates: Sequence[DelegateChoice]
    tables: Callable[[], tuple[list[Any], Sequence[Sequence[Callable[[], Any]]]]]
    written: frozenset[int]
    has_state: bool
    straight: bool
    dynamic: bool
    input_positions: Mapping[int, int]
    output_values: Sequence[int]
    copy_out: Callable[[Any], Any]
    # What one engine built that another may reuse (the ONNX form, say), by key.
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def env(self) -> list[Any]:
        """The method's value table (made now if not yet)."""
        return self.tables()[0]

    @property
    def steps(self) -> Sequence[Sequence[Callable[[], Any]]]:
        """Each chain's prepared instructions (made now if not yet)."""
        return self.tables()[1]


class AcceleratedMethod(Protocol):
    """A method an engine runs: `run` returns the outputs, or None to let the
    interpreter run that call; `length` is charged to the run's step budget."""

    length: int

    def run(self, inputs: Sequence[Any]) -> list[Any] | None:
        """The method's outputs for checked `inputs`, or None."""


class Engine(Protocol):
    """An optional engine (see the module docstring)."""

    name: str
    runs_delegates: bool  # whether it is offered single delegates at all

    def missing(self) -> str:
        """Why it cannot run here ("" if it can): a package not installed."""

    def prepare_delegate(self, backend_id: str, handle: Any,
                         policy: EnginePolicy) -> Any | Refusal | None:
        """A handle with `execute(args)` doing the delegate's work (and, optionally,
        `release()` to free what it holds, `artifacts` for --dump-engine), a
        refusal, or None for a delegate it has nothing to do with."""

    def prepare_method(self, view: MethodView, policy: EnginePolicy
                       ) -> tuple[AcceleratedMethod, str] | Refusal:
        """The method accelerated and how it runs, in words; or a refusal."""


@dataclass(frozen=True)
class DelegateChoice:
    """The engine one delegate runs on, and why not on the others; `handle` is
    the engine's (run through `ENGINE_RUNNER`), None on the reference path."""

    engine: str
    refusals: tuple[Refusal, ...] = ()
    handle: Any = None

    def describe(self) -> str:
        why = "; ".join(map(str, self.refusals))
        return f"{self.engine}{f' ({why})' if why else ''}"


@dataclass(frozen=True)
class MethodChoice:
    """The engine a method's plain runs use, and how, in words."""

    engine: str
    execution: str
    accelerated: AcceleratedMethod | None = None
    refusals: tuple[Refusal, ...] = ()


class EngineRunner:
    """Stands in for the backend at a DelegateCall an engine took: it calls the
    engine's handle, which falls back to the backend's own path where it must."""

    def execute(self, handle: Any, args: list[Any]) -> None:
        handle.execute(args)


ENGINE_RUNNER = EngineRunner()

# Built-in engines, in the order they are offered a method: LiteRT first where
# it takes a chain (its XNNPACK kernels are the fastest measured), onnxruntime next.
BUILT_IN = {"litert": "exirc.runtime.engines.litert.engine:LITERT_ENGINE",
            "onnxruntime": "exirc.runtime.engines.onnxruntime.engine:ONNXRUNTIME_ENGINE"}
_EXTRA: dict[str, Engine] = {}  # engines registered at run time (tests, plugins)


def register_engine(engine: Engine) -> None:
    """Offer `engine` too, first, when the policy names it (`load(engine=name)`)."""
    _EXTRA[engine.name] = engine


def unregister_engine(name: str) -> None:
    _EXTRA.pop(name, None)


def _engines(policy: EnginePolicy) -> list[Engine]:
    """The engines the policy lets run, in the order they are offered work."""
    if policy.is_reference:
        return []
    if policy.requested in _EXTRA:
        return [_EXTRA[policy.requested]]
    found = []
    for name, where in BUILT_IN.items():
        if policy.allows(name):
            module, attribute = where.split(":")
            found.append(getattr(importlib.import_module(module), attribute))
    return found


def check_policy(policy: EnginePolicy) -> None:
    """A policy that names an engine this machine lacks is a UsageError, at load."""
    if policy.requested in BUILT_IN:
        engine = next(e for e in _engines(policy) if e.name == policy.requested)
        missing = engine.missing()
        if missing:
            raise UsageError(f"{policy.source} asks for {policy.requested}, but {missing}",
                             hint=f"{INSTALL_HINTS[policy.requested]}, or choose another "
                                  "engine (auto or reference)")
    elif policy.requested not in ENGINE_NAMES and policy.requested not in _EXTRA:
        raise UsageError(f"{policy.source} asks for engine {policy.requested!r}, which exirc "
                         "does not have", hint=f"choose one of {', '.join(ENGINE_NAMES)}")


def prepare_delegate(policy: EnginePolicy, backend_id: str, handle: Any,
                     label: str) -> DelegateChoice:
    """The engine one delegate runs on (see the module docstring); `label` names it
    in --dump-engine's files (`forward.delegate0`)."""
    refusals = []
    for engine in _engines(policy):
        if not engine.runs_delegates:
            continue
        missing = engine.missing()
        if missing:
            refusals.append(Refusal(engine.name, missing))
            continue
        taken = engine.prepare_delegate(backend_id, handle, policy)
        if taken is None:
            continue
        if isinstance(taken, Refusal):
            refusals.append(taken)
            continue
        _dump(policy, label, engine.name, getattr(taken, "artifacts", ()))
        return DelegateChoice(engine.name, tuple(refusals), taken)
    return DelegateChoice(REFERENCE, tuple(refusals))


def prepare_method(policy: EnginePolicy, view: MethodView) -> MethodChoice:
    """The engine a method's plain runs use (see the module docstring)."""
    refusals: list[Refusal] = []
    for engine in _engines(policy):
        missing = engine.missing()
        if missing:
            refusals.append(Refusal(engine.name, missing))
            continue
        taken = engine.prepare_method(view, policy)
        if isinstance(taken, Refusal):
            refusals.append(taken)
            continue
        accelerated, how = taken
        for _, handle in view.backends:
            # Inside the method's engine, a delegate's own would hold its weights twice
            # (it is made again if a call goes instruction by instruction).
            release = getattr(handle, "release", None)
            if release is not None:
                release()
        _dump(policy, view.name, engine.name, getattr(accelerated, "artifacts", ()))
        shown = [r for r in refusals if r.engine != engine.name]
        note = f" ({'; '.join(map(str, shown))})" if shown else ""
        return MethodChoice(engine.name, how + note, accelerated, tuple(refusals))
    return MethodChoice(REFERENCE, instruction_by_instruction(policy, refusals),
                        None, tuple(refusals))


def instruction_by_instruction(policy: EnginePolicy, refusals: Sequence[Refusal]) -> str:
    """How a method no engine took runs, and why no engine took it."""
    if policy.is_reference:
        return f"instruction by instruction ({policy.source})"
    if not refusals:
        return "instruction by instruction"
    return f"instruction by instruction (not fused: {refusals[-1].reason})"


def write_engine_summary(folder: Path, methods: Sequence[tuple[str, str, Sequence[str]]]
                         ) -> None:
    """`engines.txt` in a --dump-engine folder: each method's engine and how it runs,
    then each of its delegates'."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, execution, delegates in methods:
        lines.append(f"method {name}: {execution}")
        lines += [f"  delegate {j}: {engine}" for j, engine in enumerate(delegates)]
    (folder / "engines.txt").write_text("\n".join(lines) + "\n")


def _dump(policy: EnginePolicy, label: str, engine: str,
          artifacts: Sequence[tuple[str, bytes]]) -> None:
    """Write what an engine built to `policy.dump_dir`: `{label}.{engine}.{suffix}`."""
    if policy.dump_dir is None:
        return
    policy.dump_dir.mkdir(parents=True, exist_ok=True)
    for suffix, data in artifacts:
        (policy.dump_dir / f"{label}.{engine}.{suffix}").write_bytes(data)
