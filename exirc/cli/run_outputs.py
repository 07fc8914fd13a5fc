"""`exirc run`'s outputs: the summary it prints, the .npz it writes (`-o`),
the latency statistics, the profile's tables, and the `--json` document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from exirc.cli.stdio import is_stdio, write_stdout_through_file

if TYPE_CHECKING:
    import numpy

    from exirc.runtime.core.method import Method
    from exirc.runtime.core.profile import Profile

_SUMMARY_VALUES = 6  # the first values of each output the summary shows


def summary(method: Method, outputs: list[Any]) -> str:
    lines = [f"method {method.name}: {len(method.inputs)} input"
             f"{'' if len(method.inputs) == 1 else 's'}, {len(outputs)} output"
             f"{'' if len(outputs) == 1 else 's'}"]
    for name, value in zip(output_names(method, len(outputs)), outputs):
        lines += _describe(name, value)
    return "\n".join(lines)


def _describe(name: str, value: Any) -> list[str]:
    import torch

    from exirc.runtime.core.arenas import SCALAR_TYPES

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


def output_names(method: Method, count: int) -> list[str]:
    """The names of `count` outputs of `method`: those the program stores
    (`logits`), else `output_N`."""
    names = method.output_names
    return [names[i] if i < len(names) else f"output_{i}" for i in range(count)]


def write_outputs(path: str, outputs: list[Any], names: list[str]) -> None:
    """Save the outputs that are arrays or numbers under their `names` in a
    .npz (`-`: stdout); say which others (None, a string) have no place in one."""
    from exirc.serialize.npy import save_arrays

    arrays = {name: _to_numpy(value) for name, value in zip(names, outputs)}
    saved = {name: array for name, array in arrays.items() if array is not None}
    if is_stdio(path):
        write_stdout_through_file(".npz", lambda file: save_arrays(file, saved))
        path = "stdout"
    else:
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


SLOWEST_SHOWN = 10  # instructions in --profile's table of the slowest


def plain_runs(method: Method) -> str:
    """How plain runs of `method` go: the engine that runs it whole, or the
    interpreter, then where its delegates run."""
    if method.engine != "reference" or not method.delegate_engines:
        return method.execution
    return f"{method.execution}; delegates on {', '.join(method.delegate_engines)}"


def timing_text(seconds: list[float], warmup: int, threads: int, profile: Profile | None,
                execution: str = "") -> str:
    """What the text output says of the runs' times: the latency statistics of
    several runs, and with a profile its tables ("" for one plain run); then how
    plain runs go (`execution`, `Method.execution`; a profiled run goes the same
    way: a method an engine runs whole is one row of the profile)."""
    parts = []
    if len(seconds) > 1:
        parts.append(latency_text(seconds, warmup, threads, profile is not None))
    if profile is not None:
        parts.append(profile_table(profile.rows(), len(seconds), threads))
        ran = profile.instruction_rows()
        if ran:
            parts.append(slowest_table(profile.slowest(SLOWEST_SHOWN), len(ran)))
    if parts and execution:
        parts.append(f"plain runs: {execution}")
    return "\n".join(parts)


def latency_text(seconds: list[float], warmup: int, threads: int, profiled: bool) -> str:
    """`--repeat`'s statistics: how many runs, after how many warm-up runs, on how
    many threads, then mean, std, min, median, p90 and max."""
    from exirc.runtime.core.profile import latency_stats

    stats = latency_stats(seconds)
    runs = f"{len(seconds)}{' profiled' if profiled else ''} run{_s(len(seconds))}"
    figures = "  ".join(f"{key.removesuffix('_ms')} {value:.3f} ms"
                        for key, value in stats.items())
    return (f"latency over {runs}, after {warmup} warm-up run{_s(warmup)}, on {threads} "
            f"thread{_s(threads)}:\n  {figures}")


def profile_table(rows: list[dict[str, Any]], runs: int, threads: int = 1) -> str:
    """The time per operator (`Profile.rows`), slowest first, with a total."""
    width = max([len("op"), *(len(row["op"]) for row in rows)])
    lines = [f"time per operator over {runs} run{_s(runs)} on {threads} thread{_s(threads)}:",
             f"  {'op':<{width}}  {'calls':>7}  {'total ms':>10}  {'share':>6}"]
    for row in rows:
        lines.append(f"  {row['op']:<{width}}  {row['calls']:>7}  {row['total_ms']:>10.3f}  "
                     f"{row['share']:>6.1%}")
    total_ms = sum(row["total_ms"] for row in rows)
    calls = sum(row["calls"] for row in rows)
    lines.append(f"  {'total':<{width}}  {calls:>7}  {total_ms:>10.3f}  {1:>6.1%}")
    return "\n".join(lines)


def slowest_table(rows: list[dict[str, Any]], ran: int) -> str:
    """The slowest instructions (`Profile.slowest`) of the `ran` that ran: where
    each is (chain:index), its op, calls, total ms, share, module and source line."""
    shown = [(f"{row['chain']}:{row['index']}", row) for row in rows]
    at_width = max([len("chain:instr"), *(len(at) for at, _ in shown)])
    op_width = max([len("op"), *(len(row["op"]) for row in rows)])
    modules = any(row["module"] for row in rows)
    module_width = max([len("module"), *(len(row["module"]) for row in rows)])
    module_head = f"  {'module':<{module_width}}" if modules else ""
    lines = [f"slowest instructions (of {ran} that ran):",
             f"  {'chain:instr':<{at_width}}  {'op':<{op_width}}  {'calls':>7}  "
             f"{'total ms':>10}  {'share':>6}{module_head}  source"]
    for at, row in shown:
        module = f"  {row['module'] or '-':<{module_width}}" if modules else ""
        lines.append(f"  {at:<{at_width}}  {row['op']:<{op_width}}  {row['calls']:>7}  "
                     f"{row['total_ms']:>10.3f}  {row['share']:>6.1%}{module}  "
                     f"{row['source'] or '(not recorded)'}")
    return "\n".join(lines)


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def run_body(path: str, method: Method, outputs: list[Any], seconds: list[float],
             profile: Profile | None, output: str | None, *, warmup: int = 0,
             threads: int = 1, trace: str | None = None) -> dict[str, Any]:
    """What `exirc run --json` reports: the outputs' facts, the runs (measured,
    warm-up, threads), how plain runs go (`Method.execution`), the latency
    statistics of several runs (--repeat), and with --profile the time per
    operator (`profile`) and per instruction that ran (`instructions`, in
    program order)."""
    from exirc.cli.json_output import output_facts
    from exirc.runtime.core.profile import latency_stats

    body: dict[str, Any] = {
        "program": path, "method": method.name, "inputs": len(method.inputs),
        "outputs": [output_facts(i, value, name) for i, (name, value)
                    in enumerate(zip(output_names(method, len(outputs)), outputs))],
        "runs": len(seconds), "warmup_runs": warmup, "threads": threads,
        "latency_ms": latency_stats(seconds) if len(seconds) > 1 else None,
        "outputs_file": None if output is None else ("-" if is_stdio(output) else output),
        "execution": method.execution,
        "engine": method.engine,
        "delegate_engines": method.delegate_engines,
    }
    if profile is not None:
        body["profile"] = profile.rows()
        body["instructions"] = profile.instruction_rows()
    if trace is not None:
        body["trace_file"] = trace
    return body
