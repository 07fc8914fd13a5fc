"""A loaded method and its run loop: the interpreter.

Loading checks the method: its input specs (`inputs`), each instruction's
cost (`work`), and everything that preparing its value table (`values`) and
one step per instruction (`steps`, a closure that runs the instruction and
returns where to jump, if anywhere) would refuse, by preparing them against
a skeleton table and dropping them. The first run makes them for good
(`_make_ready`): a torch tensor per value and a closure per instruction cost
tens of times the bytes the file spends on them, and a program loaded to be
inspected, or one of many methods, may never run. Running is then only
this: check the inputs, copy them into their planned memory, call each
chain's steps in order (following jumps, within a budget), and copy the
outputs out so they survive the next run. One method instance runs one call
at a time (its arenas are shared state).

The budget bounds a run's work, so that a file that loops forever is stopped
(`StepLimitError`). Straight-line code is bounded by its length, so only
jumps need watching: a chain's instructions are counted once as it starts,
and each backward jump taken is charged, before it re-runs them, the cost of
the instructions between its destination and itself, each weighted by its
work (`exirc.runtime.core.work`: one step for an instruction over small tensors,
more for a big convolution). Loops also read clocks now and then
(`exirc.runtime.core.loop_clocks`): CPU time, a backstop for work the estimates
miss, and wall-clock time only if the caller set `max_seconds`, so a busy
machine never changes how a run ends. The plain loop thus pays per
instruction only for the call and the test for a jump. A chain with no jumps
at all (most are) pays not even that: it runs as a plain `for` over its actions
(`steps.Prepared`), where a kernel call is a partial of the kernel, with no
Python frame of its own; a failure is located by how far the loop got.

`run(observer=...)` calls `observer(chain, index)` after each instruction
runs, so a debugger (`exirc compile --verify` localizing a mismatch) can read
what it wrote with `value()` before later instructions reuse the memory.
Observed runs take a separate, slower loop, as profiled ones do. A method an
engine took at load (`exirc.runtime.engines.seam`) runs there, on the inputs
where the caller has them; the plan is fed only if the interpreter runs the call.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy
import torch

from exirc.runtime.core import arenas as memory
from exirc.runtime.core.argument_checks import check_method
from exirc.runtime.core.external_data import ProgramFiles
from exirc.runtime.core.inputs import InputSpec, check_inputs, input_spec, signature
from exirc.runtime.core.instruction_places import InstructionPlaces
from exirc.runtime.core.loop_clocks import LoopClocks
from exirc.runtime.core.steps import Action, Step, prepare, site_of
from exirc.runtime.core.values import Values, copied_out, value_table, written_values
from exirc.runtime.core.work import (
    chain_costs,
    prefix_sums,
    step_limit_error,
    work_limit_error,
)
from exirc.runtime.engines.policy import EnginePolicy
from exirc.runtime.engines.seam import DelegateChoice, MethodView, prepare_method
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels.registry import Kernel
from exirc.serialize import program as P
from exirc.serialize.io_names import default_names
from exirc.serialize.symbolic_shapes import MethodShapes

if TYPE_CHECKING:
    from exirc.runtime.core.profile import Profile

Observer = Callable[[int, int], None]
"""`observer(chain, index)`: called after instruction `index` of `chain` has run."""

DEFAULT_MAX_STEPS = 1_000_000_000
"""Steps one run may take: each instruction once, plus, for each time a loop
repeats an instruction, its cost (1 over small tensors, more over large
ones; `exirc.runtime.core.work`). A backstop against a program that never ends,
not a limit real programs meet (ExecuTorch's runtime has none): 300 passes
of tanh(y @ w) over 512x512 matrices take 21 million steps (a second of a
core), 2% of it. A loop that never ends is stopped after about a minute of
big operators (their estimates err high), ten of the cheapest instructions
(1.3 million steps a second). For a file you do not trust, give a tight
limit (1,000,000: a second or two of work) and `max_seconds`."""

Allowance = tuple[int, float]
"""What a run has left as it moves from chain to chain: its steps, and when
(`time.monotonic`) its loops next read the clocks (`LoopClocks`)."""


class Method:
    """One method of a loaded program, ready to run."""

    def __init__(self, program: P.Program, plan: P.ExecutionPlan, where: str,
                 kernels: Mapping[int, Kernel], backends: Sequence[tuple[Any, Any]],
                 max_steps: int = DEFAULT_MAX_STEPS, shapes: MethodShapes | None = None,
                 shared_arenas: dict[int, memory.Arena] | None = None, *,
                 max_seconds: float | None = None, files: ProgramFiles | None = None,
                 policy: EnginePolicy | None = None,
                 delegate_choices: Sequence[DelegateChoice] = ()) -> None:
        """`max_steps` bounds a run's work (see `DEFAULT_MAX_STEPS`), and with it
        the CPU time its loops may spend; `max_seconds`, if given, its wall-clock
        time (`clocks`). `files` (external tensors, and the mapped files read in
        place) is checked before each run: a file truncated since the load
        would fault (SIGBUS) instead of failing."""
        self.name = plan.name
        self._files = files or ProgramFiles()
        self.shapes = shapes
        self.max_steps = max_steps
        self.clocks = LoopClocks(plan.name, max_steps, max_seconds)
        self._program, self._plan, self._plan_where = program, plan, where
        self._kernels, self._backends = kernels, backends
        self._arenas = memory.allocate_arenas(plan, shared_arenas)
        # (where in an arena, initial bytes) of each tensor that is program state
        self._initial_state: list[tuple[Any, memoryview]] = []
        # The checks read a skeleton of the value table: every tensor is made (and
        # so checked) but not kept (`values`); the real table waits for a run.
        skeleton = value_table(program, plan, self._arenas, where, self._initial_state,
                               keep_tensors=False, external=self._files.tensors)
        self.reset_state()
        self._written = written = written_values(plan, kernels)
        values = Values(skeleton, plan.values, written)
        check_method(plan, kernels, values, where)
        self.inputs: list[InputSpec] = [input_spec(plan, i, value, where, shapes)
                                        for i, value in enumerate(plan.inputs)]
        self.output_values = list(plan.outputs)
        self._positions = {value: i for i, value in enumerate(plan.inputs)}  # the last wins
        self.output_names = default_names(0, len(plan.outputs)).outputs  # io_names renames
        # Each chain's module paths (`name_modules`), for its instructions' sites.
        self._places = InstructionPlaces(plan, self.name)
        # Per chain, prefix sums of the instructions' costs (what a backward jump
        # charges) and of their costs beyond one step (the careful loop's count).
        self._costs: list[Sequence[int]] = []
        self._extras: list[Sequence[int]] = []
        handles = [handle for _, handle in backends]
        for c, chain in enumerate(plan.chains):
            # Every instruction is prepared now, as the first run will prepare it,
            # so a file it would refuse is refused at load; the step is dropped.
            for i, instr in enumerate(chain.instructions):
                prepare(instr, kernels, backends, values, self._at(c, i))
            costs = chain_costs(plan, chain, kernels, handles, written)
            self._costs.append(prefix_sums(costs))
            self._extras.append(prefix_sums([cost - 1 for cost in costs]))
        del skeleton, values
        # What runs, made by `_make_ready` before the first run (None until then):
        # the value table; per chain, its steps; per chain, its actions if it has
        # no jumps (run by `_execute_straight`), else None; and the run-time
        # scalars' starting values, restored before each run so that a failed run
        # (a loop counter left mid-way) cannot change the next one.
        self._env: list[Any] | None = None
        self._chains: list[list[Step]] | None = None
        self._straight: list[list[Action] | None] = []
        self._scalar_starts: list[tuple[int, Any]] = []
        self._profiled: tuple[Profile, list[list[Step]]] | None = None
        # Which engine runs plain runs (`exirc.runtime.engines.seam`), and how, in words.
        straight = not any(isinstance(instr, P.JumpFalseCall)
                           for chain in plan.chains for instr in chain.instructions)
        view = MethodView(self.name, plan, kernels, backends, delegate_choices,
                          self._tables, written, self.has_state, straight,
                          bool(shapes is not None and shapes.values),
                          self._positions, self.output_values, copied_out)
        choice = prepare_method(policy or EnginePolicy.resolve(), view)
        self._accelerated, self.engine, self.execution = (choice.accelerated, choice.engine,
                                                          choice.execution)
        self.delegate_engines = [c.describe() for c in delegate_choices]

    @property
    def accelerated(self) -> Any:
        """What the engine that runs the method whole built (None on the reference)."""
        return self._accelerated

    @property
    def has_state(self) -> bool:
        """Whether the method keeps state (buffers it updates) from run to run."""
        return bool(self._initial_state)

    def reset_state(self) -> None:
        """Put the program state this method holds back to its initial value."""
        self._files.check()  # the initial values are read from the file
        for target, initial in self._initial_state:
            target[:] = numpy.frombuffer(initial, dtype=numpy.uint8)

    def _at(self, chain: int, index: int) -> str:
        """How errors about the file name instruction `index` of `chain`."""
        label = site_of(self._plan, chain, index).label
        return f"{self._plan_where}.chains[{chain}].instructions[{index}] ({label})"

    def _make_ready(self) -> None:
        """Make the value table and every chain's steps: what a run needs.

        Loading checked all of it against a skeleton table with the same code,
        so nothing here refuses a file; it is left to the first run (or the
        first look at the table) because a torch tensor per value and a step
        per instruction cost tens of times the file's bytes."""
        plan = self._plan
        env = value_table(self._program, plan, self._arenas, self._plan_where, [],
                          external=self._files.tensors)
        values = Values(env, plan.values, self._written)
        chains: list[list[Step]] = []
        straight: list[list[Action] | None] = []
        for c, chain in enumerate(plan.chains):
            steps, actions = [], []
            for i, instr in enumerate(chain.instructions):
                prepared = prepare(instr, self._kernels, self._backends, values, self._at(c, i))
                steps.append(prepared.step)
                actions.append(prepared.action)
            chains.append(steps)
            kept = [action for action in actions if action is not None]
            straight.append(kept if len(kept) == len(actions) else None)
        self._scalar_starts = [(i, env[i]) for i in sorted(self._written)]
        self._straight = straight
        self._env = env
        self._chains = chains  # last: run() takes a None here to mean "not ready"

    def _tables(self) -> tuple[list[Any], list[list[Step]]]:
        """The value table and steps, made now if not yet (what engines read)."""
        if self._chains is None:
            self._make_ready()
        assert self._env is not None and self._chains is not None
        return self._env, self._chains

    # -- running ---------------------------------------------------------------

    def run(self, inputs: Sequence[Any] | Mapping[str, Any] = (),
            profile: Profile | None = None, observer: Observer | None = None) -> list[Any]:
        """Run the method on `inputs` (tensors, numpy arrays or scalars, in order or
        by name) and return its outputs, which the next run does not overwrite.

        `observer(chain, index)`, if given, is called after every instruction
        that runs, in execution order (see the module docstring)."""
        self._files.check()
        checked = check_inputs(self.name, self.inputs, self.shapes, inputs)
        if self._chains is None:
            self._make_ready()  # once: what loading checked but did not keep
        env = self._env
        assert env is not None
        for index, start in self._scalar_starts:
            env[index] = start
        fast = self._accelerated
        if fast is not None and observer is None and self.max_steps >= fast.length:
            outputs = fast.run(checked) if profile is None else \
                profile.time_engine(self.execution, fast.run, checked)
            if outputs is not None:
                return outputs
        try:
            self._feed(checked)
        except Exception as error:  # noqa: BLE001 (a plan whose input memory is unusable)
            raise ExecutionError(f"cannot copy the inputs of method {self.name!r} into its "
                                 f"planned memory: {type(error).__name__}: {error}") from error
        chains = self._chains if profile is None else self._profiled_chains(profile)
        assert chains is not None
        allowance: Allowance = (self.max_steps, self.clocks.start())
        for c, steps in enumerate(chains):
            if observer is None and allowance[0] >= len(steps):
                actions = self._straight[c] if profile is None else None
                if actions is not None:
                    allowance = self._execute_straight(c, actions, allowance)
                else:
                    allowance = self._execute(c, steps, allowance)
            else:
                allowance = self._execute_careful(c, steps, allowance, observer)
        return [copied_out(env[index]) for index in self.output_values]

    def _execute(self, chain: int, steps: list[Step], allowance: Allowance) -> Allowance:
        """The interpreter: run one chain's steps, following jumps, within `allowance`.

        The chain's length is charged up front (the caller checked it fits), so
        straight-line code runs unwatched; a backward jump is charged the cost
        of the instructions it is about to re-run, and now and then reads the
        clocks."""
        budget, next_reading = allowance
        end = len(steps)
        budget -= end
        costs = self._costs[chain]
        clock = time.monotonic
        pc = 0
        try:
            while pc < end:
                jump = steps[pc]()
                if jump is None:
                    pc += 1
                elif jump > pc:
                    pc = jump
                else:  # a loop: instructions jump to pc run again
                    budget -= costs[pc + 1] - costs[jump]
                    if budget < 0:
                        raise work_limit_error(self.name, self.max_steps, costs, chain, jump, pc)
                    # A fast clock, inline: this runs once per loop iteration.
                    if clock() >= next_reading:
                        next_reading = self.clocks.read(chain, jump)
                    pc = jump
        except Exception as error:  # noqa: BLE001 (any kernel's failure, named and re-raised)
            blamed = self._places.blame(chain, pc, error)
            if blamed is error:
                raise
            raise blamed from error
        return budget, next_reading

    def _execute_straight(self, chain: int, actions: list[Action],
                          allowance: Allowance) -> Allowance:
        """`_execute` for a chain with no jumps: each action once, in order.

        The chain's length is charged as in `_execute`. A failing action is
        found from the iterator: the instructions it has yet to hand out."""
        remaining = iter(actions)
        try:
            for action in remaining:
                action()
        except Exception as error:  # noqa: BLE001 (as in _execute)
            pc = len(actions) - operator.length_hint(remaining) - 1
            blamed = self._places.blame(chain, pc, error)
            if blamed is error:
                raise
            raise blamed from error
        return allowance[0] - len(actions), allowance[1]

    def _execute_careful(self, chain: int, steps: list[Step], allowance: Allowance,
                         observer: Observer | None) -> Allowance:
        """`_execute`, counting each instruction as it runs, and calling `observer`
        (if any) after each step: for observed runs, and for a chain longer than
        the steps left, so that the limit names the instruction where they ran
        out. A separate loop, so the plain one pays nothing for it; the
        observer's own errors are not blamed on the instruction."""
        budget, next_reading = allowance
        extras = self._extras[chain]
        pc = 0
        end = len(steps)
        while pc < end:
            at = pc
            try:
                jump = steps[at]()
            except Exception as error:  # noqa: BLE001 (as in _execute)
                blamed = self._places.blame(chain, at, error)
                if blamed is error:
                    raise
                raise blamed from error
            pc = at + 1 if jump is None else jump
            budget -= 1
            if budget < 0:
                raise step_limit_error(self.name, self.max_steps, chain, pc)
            if jump is not None and jump <= at:
                # The re-run instructions' work beyond the one step each is
                # counted for as it runs.
                budget -= extras[at + 1] - extras[jump]
                if budget < 0:
                    raise work_limit_error(self.name, self.max_steps, self._costs[chain],
                                           chain, jump, at)
                if time.monotonic() >= next_reading:
                    next_reading = self.clocks.read(chain, jump)
            if observer is not None:
                observer(chain, at)
        return budget, next_reading

    def _feed(self, inputs: list[Any]) -> None:
        """Put checked inputs where the program reads them."""
        env = self._env
        assert env is not None
        for spec, value in zip(self.inputs, inputs):
            if spec.kind != "tensor":
                env[spec.value] = value
                continue
            target: torch.Tensor = env[spec.value]
            if not spec.planned:
                memory.alias(target, value.contiguous())  # memory supplied at run time: use it
                continue
            if target.shape != value.shape:
                target.resize_(value.shape)
            target.copy_(value)

    def name_modules(self, modules: Sequence[Sequence[str]]) -> None:
        """Name in each instruction's site the submodule it came from (`modules`:
        per chain, a path per instruction; `exirc.runtime.core.module_paths`)."""
        if len(modules) == len(self._plan.chains):
            self._places.modules = modules
            self._profiled = None

    def _profiled_chains(self, profile: Profile) -> list[list[Step]]:
        if self._profiled is None or self._profiled[0] is not profile:
            assert self._chains is not None
            wrapped = [profile.wrap(steps, self._places.sites(c))
                       for c, steps in enumerate(self._chains)]
            self._profiled = (profile, wrapped)
        return self._profiled[1]

    # -- inspecting ------------------------------------------------------------

    def value(self, index: int) -> Any:
        """The object behind value `index` now: a tensor over planned or file memory,
        a scalar, a list. For debugging and tests; a run may change it in place."""
        return self._tables()[0][index]

    def signature(self) -> str:
        """`input_0: f32[2, 8], input_1: int`."""
        return signature(self.inputs)

