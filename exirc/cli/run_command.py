"""`exirc run`: run a method of a program file on given or random inputs.

The command is a thin layer over `exirc.runtime`: it reads inputs, loads,
runs, and prints. torch is imported only when the command runs, so the rest
of the CLI stays fast.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click

from exirc.cli.plugins import import_plugin
from exirc.errors import ResourceError, UsageError, VerificationError
from exirc.serialize.files import check_output_path
from exirc.serialize.mapped_file import refuse_special_file

if TYPE_CHECKING:
    import numpy
    import torch

    from exirc.runtime.inputs import InputSpec
    from exirc.runtime.loader import LoadedProgram
    from exirc.runtime.method import Method
    from exirc.serialize.npy_expected import ExpectedArray

EPILOG = """\b
Examples:
  exirc run model.pte --inputs x.npy                 one input from a .npy file
  exirc run model.pte --inputs x.npy --inputs y.npy  several inputs, in order
  exirc run model.pte --inputs inputs.npz            keys: input names (input_0, ...)
  exirc run model.pte --random --seed 1 -o out.npz   random inputs; outputs to a .npz
  exirc run model.pte --random --repeat 100          latency: min, median, p90, max
  exirc run model.pte --random --profile             time per operator
  exirc run model.pte --random --plugin my_kernels   kernels/backends from a module
  exirc run model.pte --check                        run the bundled test cases

Inputs are checked against the method's signature (count, dtype, rank,
shape) before anything runs.

--check runs the test cases `exirc compile --bundle` stored in the program
(every method's, or --method's) and compares each output with the expected
one, within the tolerance stored with them: a line per case, exit code 0 if
all pass and 5 if any fails.
"""

_SUMMARY_VALUES = 6


@click.command("run", epilog=EPILOG)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--inputs", "-i", "input_paths", multiple=True, metavar="FILE",
              help="A .npy per input (repeatable, in order), or one .npz of all inputs.")
@click.option("--random", "random_inputs", is_flag=True,
              help="Feed random inputs of the planned shapes (upper bounds when dynamic).")
@click.option("--seed", type=int, default=None, help="Seed for --random (default 0).")
@click.option("--method", "method_name", default=None,
              help="Method to run (default: forward, or the only method).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the outputs to this .npz (keys output_0, ...).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times and print latency statistics.")
@click.option("--profile", "profile_ops", is_flag=True, help="Print the time spent per operator.")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Import a module (name or .py path) that registers kernels or backends.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Work one run may do, in steps: each instruction once, plus, each time a "
                   "loop repeats one, a step per 1,000 element operations it does; loops also "
                   "get 2.5 µs of wall-clock time per step (default 1,000,000).")
@click.option("--allow-any-aten-op", "allow_any_aten", is_flag=True,
              help="Also run ATen operators outside the runtime's allowlist, straight from "
                   "torch. This trusts the file: some ATen kernels crash on bad arguments.")
@click.option("--max-memory", type=str, default=None, metavar="SIZE",
              help="Refuse programs planning more memory than this, e.g. 512M or 2G.")
@click.option("--check", is_flag=True,
              help="Run the test cases bundled in the program (`exirc compile --bundle`) and "
                   "report pass or fail (exit code 5 if any fails).")
def run_command(path: str, input_paths: tuple[str, ...], random_inputs: bool, seed: int | None,
                method_name: str | None, output: str | None, repeat: int, profile_ops: bool,
                plugins: tuple[str, ...], max_steps: int | None, allow_any_aten: bool,
                max_memory: str | None, check: bool) -> None:
    """Run a method of the program file PATH and summarise its outputs."""
    if check:
        given = [flag for flag, used in (("--inputs", input_paths), ("--random", random_inputs),
                                         ("--seed", seed is not None), ("-o", output),
                                         ("--repeat", repeat > 1), ("--profile", profile_ops))
                 if used]
        if given:
            raise UsageError(f"--check runs the bundled inputs; it does not take "
                             f"{', '.join(given)}")
    if input_paths and random_inputs:
        raise UsageError("give --inputs or --random, not both")
    if seed is not None and not random_inputs:
        raise UsageError("--seed only applies to --random")
    if output:
        check_output_path(output, "outputs file")  # before a run that may take minutes
    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin:
            refuse_special_file(plugin, "plugin file")
        import_plugin(plugin)
    if plugins:
        from exirc.compiler import install_backend_kernels

        install_backend_kernels()  # a plugin's ops bound to patterns run as those patterns

    from exirc.runtime import Profile, load
    from exirc.runtime.method import DEFAULT_MAX_STEPS
    from exirc.runtime.profile import latency_stats

    with _out_of_memory(f"loading the program {path}"):
        program = load(path, max_memory=_parse_size(max_memory) if max_memory else None,
                       max_steps=max_steps or DEFAULT_MAX_STEPS, allow_any_aten=allow_any_aten)
    if check:
        with _out_of_memory("running the bundled test cases"):
            _check_bundled(program, method_name)
        return
    method = program.method(_method_name(program, method_name))
    inputs: Sequence[Any] | dict[str, Any]
    if random_inputs:
        with _out_of_memory("making random inputs"):
            inputs = _random_inputs(method.inputs, 0 if seed is None else seed)
    else:
        with _out_of_memory("reading the inputs"):
            inputs = _read_inputs(method, input_paths)

    profile = Profile() if profile_ops else None
    times = []
    outputs: list[Any] = []
    with _out_of_memory(f"running method {method.name!r}"):
        for _ in range(repeat):
            start = time.perf_counter()
            outputs = method.run(inputs, profile=profile)
            times.append(time.perf_counter() - start)

    click.echo(_summary(method, outputs))
    if repeat > 1:
        stats = latency_stats(times)
        click.echo(f"latency over {repeat} runs: min {stats['min_ms']:.3f} ms, median "
                   f"{stats['median_ms']:.3f} ms, p90 {stats['p90_ms']:.3f} ms, "
                   f"max {stats['max_ms']:.3f} ms")
    if profile is not None:
        click.echo(_profile_table(profile.rows(), repeat))
    if output:
        with _out_of_memory(f"writing the outputs to {output}"):
            _write_outputs(output, outputs)


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


def _parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = cleaned, ""
    if cleaned and cleaned[-1] in units:
        number, unit = cleaned[:-1], cleaned[-1]
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise UsageError(f"--max-memory {text!r} is not a size", hint="e.g. 512M, 2G") from None


# ---------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------


def _read_inputs(method: Method, paths: tuple[str, ...]) -> Sequence[Any] | dict[str, Any]:
    from exirc.serialize.npy import load_array_files, load_arrays

    specs = method.inputs
    if not paths:
        if specs:
            raise UsageError(f"method {method.name!r} takes {len(specs)} input"
                             f"{'s' if len(specs) > 1 else ''} ({method.signature()})",
                             hint="give them with --inputs FILE, or use --random")
        return []
    from exirc.serialize.npy_expected import ExpectedArrays

    # Every header is checked against the signature before any data is read
    # (or decompressed): a wrong input costs a few hundred bytes, whatever it claims.
    expected = ExpectedArrays(f"method {method.name!r}",
                              [_expected_array(spec) for spec in specs],
                              method.shapes.symbols if method.shapes is not None else {})
    if len(paths) == 1 and paths[0].endswith(".npz"):
        return load_arrays(paths[0], expected)
    npz = [path for path in paths if path.endswith(".npz")]
    if npz:
        raise UsageError(f"{npz[0]}: a .npz holds all the inputs; give it as the only --inputs")
    return load_array_files(paths, expected)


def _expected_array(spec: InputSpec) -> ExpectedArray:
    """What the file of input `spec` must hold, as its .npy header will say it."""
    from exirc.serialize.npy_expected import ExpectedArray

    signature = spec.describe()
    if spec.kind != "tensor" or spec.dtype is None:
        kinds = {"int": "iu", "float": "iuf", "bool": "b"}.get(spec.kind, "")
        return ExpectedArray(spec.name, signature, (), kinds=kinds)
    return ExpectedArray(spec.name, signature, spec.shape, at_most=spec.dynamic,
                         dtype=_numpy_dtype(spec.dtype), symbol_dims=spec.symbol_dims)


def _numpy_dtype(dtype: torch.dtype) -> numpy.dtype[Any] | None:
    """numpy's equal of `dtype`; None for those numpy lacks (bfloat16, float8, bits16)."""
    import torch

    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None


def _random_inputs(specs: Sequence[InputSpec], seed: int) -> list[Any]:
    """Standard-normal floats, and 0 or 1 for integers and bools (safe as indices)."""
    import math

    import numpy
    import torch

    from exirc.runtime.arenas import available_memory

    needed = sum(math.prod(spec.shape) * spec.dtype.itemsize for spec in specs
                 if spec.dtype is not None)
    available = available_memory()
    if available is not None and needed > available // 2:
        raise UsageError(f"random inputs of these shapes need {needed} bytes, more than half "
                         "the memory available", hint="give the inputs with --inputs")
    rng = numpy.random.default_rng(seed)
    values: list[Any] = []
    for spec in specs:
        if spec.kind == "int":
            values.append(1)
        elif spec.kind == "float":
            values.append(float(rng.standard_normal()))
        elif spec.kind == "bool":
            values.append(bool(rng.integers(0, 2)))
        elif spec.dtype is not None and spec.dtype.is_floating_point:
            floats = rng.standard_normal(spec.shape, dtype=numpy.float32)
            values.append(torch.from_numpy(floats).to(spec.dtype))
        else:
            assert spec.dtype is not None  # a tensor spec always has one
            integers = torch.from_numpy(rng.integers(0, 2, size=spec.shape))
            values.append(_as_dtype(integers, spec.dtype))
    return values


def _as_dtype(integers: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`integers` converted to `dtype`, or, for element types torch cannot convert
    to (bits16), the same small values as unsigned integers of its width, reinterpreted."""
    import torch

    try:
        return integers.to(dtype)
    except (NotImplementedError, RuntimeError):
        unsigned = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
        return integers.to(unsigned[dtype.itemsize]).view(dtype)


# ---------------------------------------------------------------------------
# Outputs.
# ---------------------------------------------------------------------------


def _summary(method: Method, outputs: list[Any]) -> str:
    lines = [f"method {method.name}: {len(method.inputs)} input"
             f"{'' if len(method.inputs) == 1 else 's'}, {len(outputs)} output"
             f"{'' if len(outputs) == 1 else 's'}"]
    for i, value in enumerate(outputs):
        lines += _describe(f"output_{i}", value)
    return "\n".join(lines)


def _describe(name: str, value: Any) -> list[str]:
    import torch

    from exirc.runtime.arenas import SCALAR_TYPES

    if not isinstance(value, torch.Tensor):
        return [f"  {name}: {value!r}"]
    dtype = SCALAR_TYPES[value.dtype].short_name if value.dtype in SCALAR_TYPES else value.dtype
    head = f"  {name}: {dtype}[{', '.join(map(str, value.shape))}]"
    if value.numel() == 0:
        return [head + "  (empty)"]
    try:
        numbers = value.detach().reshape(-1).to(torch.float64)
    except (NotImplementedError, RuntimeError):  # opaque element types (bits16)
        return [head + "  (raw bits: values not shown)"]
    if not value.dtype.is_floating_point:
        stats = (f"  min {_num(numbers.min().item())}  max {_num(numbers.max().item())}"
                 f"  mean {numbers.mean().item():.4g}")
    else:
        stats = (f"  min {numbers.min().item():.4g}  max {numbers.max().item():.4g}"
                 f"  mean {numbers.mean().item():.4g}")
    shown = ", ".join(_num(v) for v in numbers[:_SUMMARY_VALUES].tolist())
    more = ", ..." if value.numel() > _SUMMARY_VALUES else ""
    return [head + stats, f"    [{shown}{more}]"]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def _write_outputs(path: str, outputs: list[Any]) -> None:
    """Save the outputs that are arrays or numbers as `output_N` in a .npz; say
    which others (None, a string) have no place in one."""
    from exirc.serialize.npy import save_arrays

    arrays = {f"output_{i}": _to_numpy(value) for i, value in enumerate(outputs)}
    saved = {name: array for name, array in arrays.items() if array is not None}
    save_arrays(path, saved)
    left_out = [f"{name} ({'None' if outputs[i] is None else type(outputs[i]).__name__})"
                for i, (name, array) in enumerate(arrays.items()) if array is None]
    note = f" (not an array, so not written: {', '.join(left_out)})" if left_out else ""
    click.echo(f"wrote {len(saved)} output{'s' if len(saved) != 1 else ''} to {path}{note}",
               err=True)


def _to_numpy(value: Any) -> numpy.ndarray[Any, Any] | None:
    """The array a .npz can hold for `value`, or None if there is none."""
    import numpy
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().contiguous()
        if tensor.dtype in (torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn,
                            torch.float8_e5m2fnuz, torch.float8_e4m3fnuz):
            tensor = tensor.to(torch.float32)  # numpy has no such dtype
        elif tensor.dtype == torch.bits16:
            tensor = tensor.view(torch.uint16)  # raw bits: numpy has no opaque type
        return tensor.numpy()
    if isinstance(value, (bool, int, float)):
        return numpy.asarray(value)
    return None


def _profile_table(rows: list[dict[str, Any]], runs: int) -> str:
    width = max([len("op"), *(len(row["op"]) for row in rows)])
    lines = [f"time per operator over {runs} run{'s' if runs != 1 else ''}:",
             f"  {'op':<{width}}  {'calls':>7}  {'total ms':>10}  {'share':>6}"]
    for row in rows:
        lines.append(f"  {row['op']:<{width}}  {row['calls']:>7}  {row['total_ms']:>10.3f}  "
                     f"{row['share']:>6.1%}")
    total_ms = sum(row["total_ms"] for row in rows)
    calls = sum(row["calls"] for row in rows)
    lines.append(f"  {'total':<{width}}  {calls:>7}  {total_ms:>10.3f}  {1:>6.1%}")
    return "\n".join(lines)
