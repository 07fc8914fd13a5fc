"""What one mutant's process does: load and run it, inspect it, report.

The runner forks each mutant from a server that imported this module (and
so torch and the runtime) but never ran a kernel. Here, in the fork, the
process limits its own memory, then drives the mutant the way its route
says, as a user can: `load(bytes)` and `Method.run` on random inputs ("api")
or on edge values ("hostile"), `exirc run` on a file ("cli": the command's
own code, in-process), or `exirc run --inputs` with a bent .npz ("npz");
then every `exirc inspect` view. It sends the runner a message before each
stage, with its CPU time then (so a crash or a hang is placed, and a stage's
CPU time known), and the outcome of every stage at the end. An outcome is
"ok", an exirc error code, or "traceback" for anything else (InternalError,
E0100, included).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol, TextIO

import click
import numpy
import torch

import exirc.runtime.core.loader  # noqa: F401 (imported here, once, by the fork server)
from exirc.cli.app import cli
from exirc.errors import ExircError, InternalError
from exirc.runtime import load
from exirc.runtime.core.loader import LoadedProgram
from exirc.serialize import bundled_cases, deserialize
from tools.mutants import input_files

_HOSTILE_INTS = [-1, -(2**31), 2**31 - 1, 2**40, 2**62, -(2**63), 1000, 10**9]

INSPECT_VIEWS = ["summary", "instructions", "memory", "size", "quantization"]


class Sender(Protocol):
    """Where a stage reports that it starts (the runner's pipe)."""

    def send(self, message: Any) -> None: ...


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 << 30  # address space of the mutant's process
    max_steps: int = 100_000  # instructions one run may execute (load(max_steps=...))
    input_bytes: int = 64 << 20  # inputs larger than this are not made (a mutated shape)
    runs: int = 2  # runs of each method: the second sees the state the first left


@dataclass
class Stage:
    name: str  # "load", "run forward", "inspect --json", ...
    outcome: str  # "ok", "skipped", an error code (E0300), or "traceback"
    detail: str = ""  # the error's type and first line
    seconds: float = 0.0
    trace: str = ""  # a raw exception's innermost frames
    note: str = ""  # what the stage was given, when the mutant does not say (a bent input file)


def ready() -> None:
    """A process that does nothing: started first, it returns once the server
    that forks mutants has finished importing."""


def run_mutant(data: bytes, route: str, seed: int, limits: Limits, log_path: str,
               conn: Connection) -> None:
    """The process's whole life: set up, drive the mutant, send the stages."""
    _isolate(limits, log_path)
    stages: list[Stage] = []
    try:
        with memfd(data) as path:
            _drive(route, path, data, seed, limits, stages, conn, os.path.dirname(log_path))
            _inspect(path, data, seed, stages, conn, one_method=route == "cli")
    except BaseException as error:  # noqa: BLE001 (the harness's own failure, reported as such)
        stages.append(Stage("harness", "harness", _first_line(error)))
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    conn.send(("done", stages, time.process_time(), rss_kib))
    conn.close()
    sys.stderr.flush()
    os._exit(0)  # nothing left to clean up: skip the interpreter's teardown


def locate_crash(data: bytes, route: str, seed: int, limits: Limits, log_path: str,
                 conn: Connection) -> None:
    """`run_mutant`'s runs again, each instruction noted (method, chain, index)
    in `log_path`.steps as it completes: after a crash, the last line says
    where it happened."""
    _isolate(limits, log_path)
    with open(f"{log_path}.steps", "w", buffering=1) as steps:
        _api_runs(data, seed, limits, [], conn, hostile=route == "hostile", steps=steps)
    conn.close()
    os._exit(0)


def pretend(data: bytes, route: str, seed: int, limits: Limits, log_path: str,
            conn: Connection) -> None:
    """A mutant's process that fails as `route` says ("crash", "spin": busy
    forever, "stall": asleep forever, "raise", "memory", or "ok"), so a test
    can check the runner tells each apart."""
    _isolate(limits, log_path)
    conn.send(("stage", "load", time.process_time()))
    if route == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    while route == "spin":
        pass
    if route == "stall":
        time.sleep(3600)
    stage = Stage("load", "ok")
    if route == "raise":
        stage = Stage("load", *outcome(ValueError("not a typed error")))
    elif route == "memory":
        try:
            bytearray(limits.memory_bytes)  # more than the address space left
        except MemoryError as error:
            stage = Stage("load", "E0340", _first_line(error))
    conn.send(("done", [stage], time.process_time(),
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    conn.close()
    os._exit(0)


def replay_here(data: bytes, route: str, seed: int, limits: Limits) -> list[Stage]:
    """The stages of `run_mutant` in this process (no limits, no fork), each
    printed with a raw exception's traceback: for debugging one reproducer."""
    stages: list[Stage] = []
    sender = _Printer()
    with memfd(data) as path, tempfile.TemporaryDirectory(prefix="mutants-replay-") as folder:
        _drive(route, path, data, seed, limits, stages, sender, folder)
        _inspect(path, data, seed, stages, sender, one_method=route == "cli")
    for stage in stages:
        print(f"  {stage.name}: {stage.outcome} {stage.detail}\n{stage.trace}".rstrip())
    return stages


class _Printer:
    """Stands in for the runner's pipe when replaying here."""

    def send(self, message: tuple[Any, ...]) -> None:
        if message[0] == "stage":
            print(f"stage: {message[1]}", flush=True)


def _drive(route: str, path: str, data: bytes, seed: int, limits: Limits, stages: list[Stage],
           conn: Sender, folder: str) -> None:
    """Load and run the mutant the way `route` says (`folder` takes files)."""
    if route == "cli":
        _cli_runs(path, data, seed, limits, stages, conn, folder)
    elif route == "npz":
        _npz_runs(path, data, seed, limits, stages, conn, folder)
    else:
        _api_runs(data, seed, limits, stages, conn, hostile=route == "hostile")


def _isolate(limits: Limits, log_path: str) -> None:
    """Limit memory, one thread, stdout to nowhere, stderr (and a crash's
    Python stack) to the log the runner reads if the process dies."""
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    torch.set_num_threads(1)
    log = open(log_path, "w")  # noqa: SIM115 (lives as long as the process)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    sys.stderr = log
    faulthandler.enable(log)


class memfd:  # noqa: N801 (used as a context manager, like open)
    """The mutant as a file (in memory) the CLI can be given a path to."""

    def __init__(self, data: bytes) -> None:
        self.fd = os.memfd_create("mutant.pte")
        os.write(self.fd, data)

    def __enter__(self) -> str:
        return f"/proc/self/fd/{self.fd}"

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def outcome(error: BaseException) -> tuple[str, str]:
    """(outcome, detail) of an exception a stage raised."""
    if isinstance(error, ExircError) and not isinstance(error, InternalError):
        return error.code, _first_line(error)
    return "traceback", _first_line(error)


def _first_line(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text[:300]}"


def _stage(name: str, stages: list[Stage], conn: Sender, fn: Any, *args: Any) -> Any:
    """Run one stage, recording its outcome; its result, or None if it failed."""
    conn.send(("stage", name, time.process_time()))
    started = time.perf_counter()
    try:
        result = fn(*args)
    except Exception as error:  # noqa: BLE001 (classified: typed or a traceback)
        code, detail = outcome(error)
        trace = "".join(traceback.format_exception(error)[-6:]) if code == "traceback" else ""
        stages.append(Stage(name, code, detail, time.perf_counter() - started, trace))
        return None
    stages.append(Stage(name, "ok", seconds=time.perf_counter() - started))
    return result if result is not None else True


# -- route "api": load(bytes), Method.run -------------------------------------


def _api_runs(data: bytes, seed: int, limits: Limits, stages: list[Stage],
              conn: Sender, *, hostile: bool = False, steps: TextIO | None = None) -> None:
    """load(bytes) on the reference interpreter, then each method run twice, then
    the same runs on the optional engines (`_engine_runs`); with `steps`, each
    reference instruction written there as it completes (`locate_crash`)."""
    program = _stage("load", stages, conn,
                     lambda: load(data, max_steps=limits.max_steps, engine="reference"))
    if program is None:
        return
    rng = numpy.random.default_rng(seed)
    answers: dict[str, list[Any]] = {}  # per method: each run's outputs, or its error code
    for name, method in program.methods.items():
        try:
            inputs = random_inputs(method.inputs, rng, limits.input_bytes, hostile=hostile)
        except Exception as error:  # noqa: BLE001 (inputs we cannot make: not the runtime's)
            stages.append(Stage(f"run {name}", "skipped", _first_line(error)))
            continue
        run: Any = method.run
        if steps is not None:
            def run(inputs: Any, method: Any = method, name: str = name) -> Any:
                steps.write(f"{name} start\n")
                return method.run(inputs, observer=lambda chain, index: steps.write(
                    f"{name} {chain} {index}\n"))
        answers[name] = []
        for n in range(limits.runs):
            got = _stage(f"run {name} #{n + 1}", stages, conn, run, inputs)
            answers[name].append(got if got is not None else stages[-1].outcome)
            if got is None:
                break
        answers[name].append(inputs)
    if program.has_state:  # the state the runs left, put back as the file has it
        _stage("reset_state", stages, conn, program.reset_state)
    if steps is None:
        _engine_runs(data, limits, stages, conn, answers)


def _engine_runs(data: bytes, limits: Limits, stages: list[Stage], conn: Sender,
                 answers: dict[str, list[Any]]) -> None:
    """The reference's runs again on the engines `auto` picks: each must give the
    reference's answer (within the engines' tolerance) or raise a typed error where
    the reference did; an answer where the reference refused, or another answer,
    is a wrong answer without an error (outcome "wrong")."""
    program = _stage("engines: load", stages, conn,
                     lambda: load(data, max_steps=limits.max_steps, engine="auto"))
    if program is None or not isinstance(program, LoadedProgram):
        return
    for name, method in program.methods.items():
        if name not in answers or (method.engine == "reference" and all(
                e.startswith("reference") for e in method.delegate_engines)):
            continue  # no engine took any of it: the reference's runs were the runs
        *expected, inputs = answers[name]
        for n, want in enumerate(expected):
            got = _stage(f"engines: run {name} #{n + 1}", stages, conn, method.run, inputs)
            wrong = _differs(got, want, stages[-1].outcome)
            if wrong:
                stages[-1] = Stage(stages[-1].name, "wrong", f"{method.execution}: {wrong}")
            if got is None:
                break


def _differs(got: Any, want: Any, outcome: str) -> str:
    """Why an engine's run does not match the reference's ("" if it does)."""
    if isinstance(want, str):  # the reference refused with this code
        return "" if got is None else f"an answer where the reference raised {want}"
    if got is None:
        return "" if outcome != "ok" else "no answer"
    if len(got) != len(want):
        return f"{len(got)} outputs, the reference {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
                return f"output {i} is not the reference's shape or dtype"
            close = torch.isclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True) \
                if b.is_floating_point() else a == b
            if not bool(close.all()):
                return f"output {i} differs from the reference's"
        elif a != b:
            return f"output {i} is {a!r}, the reference's {b!r}"
    return ""


def random_inputs(specs: Any, rng: numpy.random.Generator, max_bytes: int, *,
                  hostile: bool = False) -> list[Any]:
    """Inputs fitting each spec: dynamic dims anywhere up to their bound, floats
    standard-normal, integers small (valid as indices and loop counts). With
    `hostile`, integers are edge values (indices out of range, loop counts in
    the billions) and floats include NaN and infinities."""
    values: list[Any] = []
    total = 0
    for spec in specs:
        if spec.kind != "tensor":
            values.append({"int": 1, "float": 0.5, "bool": True}[spec.kind])
            continue
        shape = [int(rng.integers(1, d + 1)) if varies and d > 1 and rng.random() < 0.5
                 else d for d, varies in zip(spec.shape, _dynamic_dims(spec))]
        count = 1
        for d in shape:
            count *= max(d, 0)
        total += count * spec.dtype.itemsize
        if total > max_bytes:
            raise ValueError(f"inputs of {total} bytes")
        if spec.dtype.is_floating_point or spec.dtype.is_complex:
            value = torch.randn(shape, dtype=spec.dtype)
            if hostile and value.numel():
                value.view(-1)[0] = float(rng.choice([numpy.nan, numpy.inf, -numpy.inf]))
        elif hostile and spec.dtype != torch.bool:
            info = torch.iinfo(spec.dtype)
            edges = [v for v in _HOSTILE_INTS if info.min <= v <= info.max]
            value = torch.tensor(rng.choice(edges, size=shape)).to(spec.dtype)
        else:
            value = torch.from_numpy(rng.integers(0, 3, size=shape)).to(spec.dtype)
        values.append(value)
    return values


def _dynamic_dims(spec: Any) -> list[bool]:
    """Which dims of an input may vary: those with a symbol, or the first of a
    dynamic tensor whose symbols the file does not say."""
    if not spec.dynamic:
        return [False] * len(spec.shape)
    if spec.symbol_dims is not None:
        return [isinstance(dim, str) for dim in spec.symbol_dims]
    return [i == 0 for i in range(len(spec.shape))]


# -- route "cli": `exirc run` and `exirc inspect`, in-process -----------------


def _cli(args: list[str]) -> None:
    """The command line's own code on `args`; raises what the command raised."""
    with contextlib.suppress(click.exceptions.Exit):  # --help, --version: not ours
        cli.main(args=args, prog_name="exirc", standalone_mode=False)


def _has_bundle(data: bytes) -> bool:
    try:
        return any(entry.key == bundled_cases.NAMED_DATA_KEY
                   for entry in deserialize(data).named_data)
    except ExircError:
        return True  # unreadable: let `--check` say so


def _method_names(data: bytes) -> list[str]:
    try:
        return [plan.name for plan in deserialize(data).execution_plan]
    except ExircError:
        return []


def _cli_runs(path: str, data: bytes, seed: int, limits: Limits, stages: list[Stage],
              conn: Sender, folder: str) -> None:
    names = _method_names(data) or ["forward"]
    outputs = os.path.join(folder, f"{os.getpid()}-outputs.npz")
    for n, name in enumerate(names):
        args = ["run", path, "--random", "--seed", str(seed % 1000), "--method", name,
                "--max-steps", str(limits.max_steps), "--repeat", str(limits.runs)]
        if n == 0:  # the profile and writing the outputs, once a mutant
            args += ["--profile", "-o", outputs]
        _stage(f"exirc run --method {name}", stages, conn, _cli, args)
    with contextlib.suppress(OSError):
        os.unlink(outputs)
    if _has_bundle(data):  # the bundled cases, on the same budget as the other runs
        _stage("exirc run --check", stages, conn, _cli,
               ["run", path, "--check", "--max-steps", str(limits.max_steps)])


def _npz_runs(path: str, data: bytes, seed: int, limits: Limits, stages: list[Stage],
              conn: Sender, folder: str) -> None:
    """`exirc run --inputs FILE.npz` with the file bent (`input_files`)."""
    program = _stage("load", stages, conn, lambda: load(data, max_steps=limits.max_steps))
    if program is None:
        return
    name, method = next(iter(program.methods.items()))
    try:
        inputs = random_inputs(method.inputs, numpy.random.default_rng(seed), limits.input_bytes)
        arrays = {spec.name: value.numpy() if isinstance(value, torch.Tensor)
                  else numpy.asarray(value) for spec, value in zip(method.inputs, inputs)}
    except Exception as error:  # noqa: BLE001 (inputs numpy cannot hold, e.g. bfloat16)
        stages.append(Stage("exirc run --inputs", "skipped", _first_line(error)))
        return
    blob, what = input_files.hostile_npz(arrays, random.Random(seed))
    archive = os.path.join(folder, f"{os.getpid()}-inputs.npz")
    with open(archive, "wb") as file:
        file.write(blob)
    _stage("exirc run --inputs", stages, conn, _cli,
           ["run", path, "--inputs", archive, "--method", name, "--max-steps",
            str(limits.max_steps)])
    stages[-1].note = what
    with contextlib.suppress(OSError):
        os.unlink(archive)


def _inspect(path: str, data: bytes, seed: int, stages: list[Stage], conn: Sender, *,
             one_method: bool = False) -> None:
    """`exirc inspect --json` and every text view; with `one_method`, the views
    of one method (`--method`) too."""
    shows = [arg for view in INSPECT_VIEWS for arg in ("--show", view)]
    _stage("inspect --json", stages, conn, _cli,
           ["inspect", path, "--json", "--show", "memory", "--show", "size"])
    _stage("inspect (all views)", stages, conn, _cli, ["inspect", path, *shows])
    names = _method_names(data) if one_method else []
    if names:
        name = names[seed % len(names)]
        _stage(f"inspect --method {name}", stages, conn, _cli,
               ["inspect", path, "--method", name, "--show", "instructions",
                "--show", "memory"])
