"""`exirc run`: run a method of a program file on given or random inputs.

The command is a thin layer over `exirc.runtime`: it reads inputs, loads,
runs, and prints. torch is imported only when the command runs, so the rest
of the CLI stays fast.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click

from exirc.cli.plugins import import_plugin
from exirc.cli.random_shapes import parse_shape_options
from exirc.cli.run_inputs import make_random_inputs, read_inputs
from exirc.cli.run_outputs import (
    output_names,
    plain_runs,
    summary,
    timing_text,
    write_outputs,
)
from exirc.cli.run_timing import default_warmup, threads_option, timed_runs, torch_threads
from exirc.cli.sizes import SIZE_HELP, size_option
from exirc.cli.stdio import is_stdio, refuse_terminal_stdout
from exirc.errors import ResourceError, UsageError, VerificationError
from exirc.runtime.engines.policy import ENGINES as ENGINE_NAMES
from exirc.serialize.files import check_output_path
from exirc.serialize.mapped_file import refuse_special_file

if TYPE_CHECKING:
    from exirc.runtime.core.loader import LoadedProgram
    from exirc.runtime.core.method import Method
    from exirc.runtime.core.profile import Profile

EPILOG = """\b
Examples:
  exirc run model.pte --inputs x.npy                 one input from a .npy file
  exirc run model.pte --inputs x.npy --inputs y.npy  several inputs, in order
  exirc run model.pte --inputs inputs.npz            keys: input names (x, or input_0, ...)
  exirc run model.pte --random --seed 1 -o out.npz   random inputs; outputs to a .npz
  exirc run model.pte --random -o - > out.npz        the .npz on stdout (summary on stderr)
  exirc run model.pte --random --repeat 100          latency: mean, std, min, median, ...
  exirc run model.pte --random --repeat 100 --threads 2   on 2 threads (default 1)
  exirc run model.pte --random --shape input_0=2x17  a dynamic input at this shape
  exirc run model.pte --random --profile             time per operator and instruction
  exirc run model.pte --random --trace trace.json    a timeline for ui.perfetto.dev
  exirc run model.pte --random --plugin my_kernels   kernels/backends from a module
  exirc run model.pte --check                        run the bundled test cases
  exirc run model.pte --data model.ptd --random      weights in an external data file
  exirc run model.pte --random --max-steps 1000000 --max-seconds 5
                                                     a file you do not trust: tight limits
  exirc run model.pte --random --repeat 10 --json    outputs and latency, for programs

Inputs are checked against the method's signature (count, dtype, rank,
shape) before anything runs.

--repeat runs the method N times after --warmup runs that are not counted
(default: none for one run, else a tenth of N, from 1 to 10) and prints the
mean, std, min, median, p90 and max. Runs use one thread unless --threads
says otherwise: torch's threads make large models faster on an idle machine,
but on a busy one wait for each other at every operator (100x slower for a
small LSTM), so one thread gives the steadiest figures.

--profile times each instruction: a table per operator, and the slowest
instructions with the source line (and module) they came from. --trace FILE
(implies --profile) also writes every instruction of every measured run as
a slice of a Chrome trace (JSON: chrome://tracing, ui.perfetto.dev), up to
200,000 slices (whole runs, at least the first).

--check runs the test cases `exirc compile --bundle` stored in the program
(every method's, or --method's) and compares each output with the expected
one, within the tolerance stored with them: a line per case, exit code 0 if
all pass and 5 if any fails.
"""


@click.command("run", epilog=EPILOG)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--data", "data_path", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="FILE.ptd",
              help="The external data file (.ptd) holding the program's weights, for a "
                   "program compiled with --external-weights (or ExecuTorch's external "
                   "constants).")
@click.option("--inputs", "-i", "input_paths", multiple=True, metavar="FILE",
              help="A .npy per input (repeatable, in order), or one .npz of all inputs.")
@click.option("--random", "random_inputs", is_flag=True,
              help="Feed random inputs: static shapes as planned; a dynamic dim its --shape, "
                   "else its upper bound up to 256 (at least its lower bound).")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME=SIZES",
              help="With --random: the shape of input NAME (as `exirc inspect` names it, or "
                   "its index), sizes joined by x, e.g. input_0=2x17 (repeatable).")
@click.option("--seed", type=int, default=None, help="Seed for --random (default 0).")
@click.option("--method", "method_name", default=None,
              help="Method to run (default: forward, or the only method).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the outputs to this .npz, keyed by their names as `exirc inspect` "
                   "shows them (logits, ..., or output_0, ...); - for stdout (not a "
                   "terminal), which moves the summary to stderr.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Run N times and print latency statistics.")
@click.option("--warmup", type=click.IntRange(min=0), default=None, metavar="N",
              help="Runs before the measured ones, not counted (default: 0 for one run, "
                   "else repeat/10 from 1 to 10).")
@click.option("--threads", type=int, default=None, callback=threads_option, metavar="N",
              help="torch's intra-op threads for the runs (default 1: the steadiest latency; "
                   "more help large models on an idle machine).")
@click.option("--profile", "profile_ops", is_flag=True,
              help="Print the time spent per operator and the slowest instructions.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=str),
              default=None, metavar="FILE",
              help="Write a Chrome trace (JSON) of the measured runs, a slice per "
                   "instruction run, for chrome://tracing or ui.perfetto.dev (implies "
                   "--profile).")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Import a module (name or .py path) that registers kernels or backends.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Work one run may do, in steps: each instruction once, plus, each time a "
                   "loop repeats one, a step per 1,000 element operations it does; loops also "
                   "get 2.5 µs of CPU time per step (default 1,000,000,000: a backstop for "
                   "a loop that never ends; for a file you do not trust, 1000000).")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="S",
              help="Stop a run still looping S seconds (wall-clock time) after it started "
                   "(default: no such limit, so how busy the machine is never changes the "
                   "outcome).")
@click.option("--allow-any-aten-op", "allow_any_aten", is_flag=True,
              help="Also run ATen operators outside the runtime's allowlist, straight from "
                   "torch. This trusts the file: some ATen kernels crash on bad arguments.")
@click.option("--max-memory", "max_memory", default=None, metavar="SIZE", callback=size_option,
              help="Refuse programs planning more memory than SIZE. " + SIZE_HELP)
@click.option("--engine", type=click.Choice(ENGINE_NAMES), default=None,
              help="What runs the program: reference (exirc's interpreter alone), auto "
                   "(optional engines where installed and exact; the default, or the "
                   "EXIRC_ENGINE variable), onnxruntime or litert. --check runs on the "
                   "reference.")
@click.option("--dump-engine", "dump_engine", type=click.Path(file_okay=False, path_type=str),
              default=None, metavar="DIR",
              help="Write the models engines build (ONNX, TFLite) and the rewrite rules "
                   "that fired to DIR, with engines.txt saying what runs where.")
@click.option("--check", is_flag=True,
              help="Run the test cases bundled in the program (`exirc compile --bundle`) and "
                   "report pass or fail (exit code 5 if any fails).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the outputs (name, index, shape, dtype, min, max, mean), the runs, "
                   "warm-up runs and threads, with --repeat the latency and with --profile "
                   "the time per operator and per instruction as JSON on stdout (format "
                   "exirc.run), or a JSON error object on failure.")
def run_command(path: str, data_path: str | None, input_paths: tuple[str, ...],
                random_inputs: bool,
                shape_options: tuple[str, ...], seed: int | None,
                method_name: str | None, output: str | None, repeat: int, warmup: int | None,
                threads: int, profile_ops: bool, trace_path: str | None,
                plugins: tuple[str, ...], max_steps: int | None, max_seconds: float | None,
                allow_any_aten: bool, max_memory: int | None, engine: str | None,
                dump_engine: str | None, check: bool, as_json: bool) -> None:
    """Run a method of the program file PATH and summarise its outputs."""
    if check:
        given = [flag for flag, used in (("--inputs", input_paths), ("--random", random_inputs),
                                         ("--seed", seed is not None), ("-o", output),
                                         ("--repeat", repeat > 1), ("--profile", profile_ops),
                                         ("--warmup", warmup is not None),
                                         ("--trace", trace_path), ("--json", as_json),
                                         ("--engine", engine is not None))
                 if used]
        if given:
            raise UsageError(f"--check runs the bundled inputs; it does not take "
                             f"{', '.join(given)}")
    if input_paths and random_inputs:
        raise UsageError("give --inputs or --random, not both")
    if seed is not None and not random_inputs:
        raise UsageError("--seed only applies to --random")
    if shape_options and not random_inputs:
        raise UsageError("--shape only applies to --random",
                         hint="inputs from files (--inputs) have their own shapes")
    requested_shapes = parse_shape_options(shape_options)
    to_stdout = is_stdio(output)
    if to_stdout and as_json:
        raise UsageError("-o - and --json both write to stdout",
                         hint="write the outputs to a file with -o FILE.npz")
    if to_stdout:
        refuse_terminal_stdout("the outputs' .npz")
    elif output:
        check_output_path(output, "outputs file")  # before a run that may take minutes
    if trace_path is not None:
        _check_trace_path(trace_path, path, None if to_stdout else output)
        profile_ops = True
    if data_path is not None:
        refuse_special_file(data_path, "data file")
    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin:
            refuse_special_file(plugin, "plugin file")
        import_plugin(plugin)
    if plugins:
        from exirc.compiler import install_backend_kernels

        install_backend_kernels()  # a plugin's ops bound to patterns run as those patterns

    from exirc.runtime import Profile, load
    from exirc.runtime.core.method import DEFAULT_MAX_STEPS

    # Loaded at the runs' thread count: a delegate's engine (onnxruntime) makes
    # its session for the count it is loaded at.
    with _out_of_memory(f"loading the program {path}"), torch_threads(threads):
        program = load(path, data=data_path, max_memory=max_memory,
                       max_steps=max_steps or DEFAULT_MAX_STEPS, max_seconds=max_seconds,
                       allow_any_aten=allow_any_aten,
                       engine="reference" if check else engine, dump_engine=dump_engine)
    if check:
        with _out_of_memory("running the bundled test cases"), torch_threads(threads):
            _check_bundled(program, method_name)
        return
    method = program.method(_method_name(program, method_name))
    inputs: Sequence[Any] | dict[str, Any]
    if random_inputs:
        with _out_of_memory("making random inputs"):
            inputs = make_random_inputs(method, 0 if seed is None else seed, requested_shapes)
    else:
        with _out_of_memory("reading the inputs"):
            inputs = read_inputs(method, input_paths)

    profile = Profile(timeline=trace_path is not None) if profile_ops else None
    warmup = default_warmup(repeat) if warmup is None else warmup
    with _out_of_memory(f"running method {method.name!r}"), torch_threads(threads):
        runs = timed_runs(method, inputs, repeat, warmup, profile)

    if output:
        with _out_of_memory(f"writing the outputs to {output}"):
            write_outputs(output, runs.outputs, output_names(method, len(runs.outputs)))
    if trace_path is not None and profile is not None:
        _write_trace(trace_path, profile, runs.on_timeline, path, method,
                     {"runs": repeat, "warmup_runs": warmup, "threads": threads})
    if as_json:
        from exirc.cli.json_output import write_document
        from exirc.cli.run_outputs import run_body

        write_document("run", run_body(path, method, runs.outputs, runs.seconds, profile,
                                       output, warmup=warmup, threads=threads,
                                       trace=trace_path))
        return
    # With -o -, stdout carries the .npz alone; what is read goes to stderr.
    click.echo(summary(method, runs.outputs), err=to_stdout)
    timing = timing_text(runs.seconds, warmup, threads, profile, plain_runs(method))
    if timing:
        click.echo(timing, err=to_stdout)


def _check_trace_path(trace: str, program: str, output: str | None) -> None:
    """Refuse, before any run, a trace that cannot be written or would replace
    the program or the outputs file."""
    if is_stdio(trace):
        raise UsageError("--trace writes to a file, not to stdout (-)",
                         hint="give it a file name, e.g. --trace trace.json")
    check_output_path(trace, "trace file")
    for other, what in ((program, "the program"), (output, "the outputs file (-o)")):
        if other is not None and os.path.realpath(other) == os.path.realpath(trace):
            raise UsageError(f"--trace {trace} would overwrite {what}",
                             hint="write the trace to a file of its own, e.g. trace.json")


def _write_trace(trace: str, profile: Profile, runs: list[tuple[float, float]], path: str,
                 method: Method, about: dict[str, Any]) -> None:
    """Write the Chrome trace atomically, and say on stderr what it holds."""
    from exirc.runtime.core.trace import write_chrome_trace
    from exirc.serialize.files import write_atomically

    slices = [0]

    def write(file: Any) -> None:
        slices[0] = write_chrome_trace(
            file, profile, runs, {"process": f"exirc run {os.path.basename(path)}",
                                  "thread": f"method {method.name}"},
            {"program": path, "method": method.name, "runs_traced": len(runs), **about})

    with _out_of_memory(f"writing the trace to {trace}"):
        write_atomically(trace, write)
    kept = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
    if len(runs) < about["runs"]:
        kept = f"the first {kept} of {about['runs']} (a trace keeps about 200,000 slices)"
    click.echo(f"wrote a trace of {kept}, {slices[0]} instruction slices, to {trace}", err=True)


@contextlib.contextmanager
def _out_of_memory(doing: str) -> Iterator[None]:
    """Report running out of memory as what it is, saying what was being done."""
    try:
        yield
    except MemoryError:
        raise ResourceError(f"out of memory while {doing}",
                            hint="free memory, or give the program smaller inputs; "
                                 "--max-memory refuses programs that plan more than a limit"
                            ) from None


def _check_bundled(program: LoadedProgram, method_name: str | None) -> None:
    """`--check`: a line per bundled case on stdout; VerificationError if any fails."""
    from exirc.diagnostics.bundle import check_bundled

    if method_name is not None:
        program.method(method_name)  # an unknown method is reported with the list
    bundle, results = check_bundled(program, method_name)
    for result in results:
        click.echo(result.line())
    failed = [result for result in results if not result.ok]
    tolerance = f"rtol {bundle.rtol:g}, atol {bundle.atol:g}"
    if failed:
        first = failed[0]
        raise VerificationError(
            f"{len(failed)} of {len(results)} bundled test case"
            f"{'s' if len(results) != 1 else ''} failed ({tolerance}); first: {first.label}: "
            + "; ".join(first.failures()),
            hint="the program no longer computes what the model did when it was compiled: "
                 "recompile with `exirc compile --verify` to find where it diverges")
    click.echo(f"{len(results)} bundled test case{'s' if len(results) != 1 else ''} "
               f"passed ({tolerance})")


def _method_name(program: LoadedProgram, requested: str | None) -> str:
    if requested is not None:
        return requested
    names = program.method_names
    if "forward" in names or len(names) != 1:
        return "forward"  # a missing forward is reported with the list of methods
    return names[0]
