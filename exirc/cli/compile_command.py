"""`exirc compile`: a PyTorch model -> a .pte program (thin over exirc.compiler)."""

from __future__ import annotations

import gc
import os
import sys
import warnings
from pathlib import Path

import click

from exirc.cli.compile_memory import memory_text, working_arenas
from exirc.cli.delegation_text import attention_lines, explain_json, explain_text, summary_line
from exirc.cli.plugins import import_plugin
from exirc.cli.progress import stage_printer, wants_progress
from exirc.cli.quantization_text import quantization_lines
from exirc.cli.sizes import SIZE_HELP, size_option
from exirc.cli.stdio import is_stdio, refuse_terminal_stdout, write_stdout
from exirc.errors import UsageError
from exirc.inspector.render import human_bytes
from exirc.serialize.files import check_output_directory, check_output_path, write_atomically
from exirc.serialize.mapped_file import refuse_special_file
from exirc.targets import DEFAULT_TARGET, builtin_targets

EPILOG = """\b
MODEL is one of:
  model.py             defines `model` and `example_inputs` (optionally
                       `dynamic_shapes` and `methods`)
  model.py:factory     factory() returns (module, example_inputs[, dynamic_shapes])
  model.pt2            saved by torch.export.save
  model.ts             a TorchScript archive saved by torch.jit.save

\b
Examples:
  exirc compile model.py -o model.pte
  exirc compile model.py:build --target exirc -o fast.pte
  exirc compile model.py -o - | exirc inspect -          # the program through a pipe
  exirc compile model.py --print-pipeline > my.yaml     # then edit it
  exirc compile model.py --pipeline my.yaml -o model.pte --time-passes
  exirc compile model.py --dump-dir ir/ -o model.pte     # the graph after every pass
  exirc compile model.py --print-ir-diff                 # what each pass changed
  exirc compile model.py --max-arena 256K -o model.pte   # fail if the plan needs more
  exirc compile model.py --max-memory 1.5M -o model.pte  # the same limit, run's name
  exirc compile model.py --verify -o model.pte           # fail (exit 5) if it differs from eager
  exirc compile model.py --verify --json -o m.pte | jq .arena_bytes   # facts for programs
  exirc compile model.py --verify --verify-inputs in.npz --atol 1e-4
  exirc compile model.py --verify --bundle -o model.pte  # then: exirc run model.pte --check
  exirc compile model.py --plugin my_kernels -o m.pte    # custom ops: kernels from a module
  exirc compile gpt2.pt2 --import transformers.modeling_outputs   # outputs of library types
  exirc compile model.py --quantize int8 --calibration-inputs a.npz --target xnnpack
  exirc compile model.py --quantize int8 --calibration-inputs a.npz --verify-inputs b.npz
  exirc compile llm.py --quantize int4-weight-only -o llm.pte
  exirc compile llm.py -o llm.pte --external-weights llm.ptd   # weights beside the program

\b
Verification (--verify): the program runs in exirc's interpreter and the
model in eager PyTorch, on the example inputs or on each --verify-inputs
.npz (keys input_0, ...; METHOD.input_0, ... for other methods). Outputs
must match in dtype, shape and value (|got - expected| <= atol + rtol *
|expected|, rtol by dtype as torch.testing.assert_close: 1e-4, float16 1e-3,
bfloat16 1.6e-2; NaN equals NaN). On a mismatch the compile fails with exit code
5, writes no file, and names the first instruction whose result diverges:
its op, graph node, source line and module. --bundle stores the inputs and
eager outputs in the program, for `exirc run --check`.

On a terminal, stderr shows each stage as it finishes (capture, edge,
plan, emit, serialize, verify, ...) with its time; -q and --json turn this
off; EXIRC_PROGRESS=1 or 0 turns it on or off whatever stderr is.

\b
Pass debugging (printed on stderr; the flags combine):
  --print-ir-after-all     the graph after every pass
  --print-ir-after-change  the graph after each pass that changed it (a pass
                           that changes the graph but says it did not gets
                           a warning); --print-ir-after-all includes these
  --print-ir-diff          a unified diff per pass that changed the graph;
                           with either flag above, the graph and then its diff
  --dump-dir DIR           files: the captured graph, the graph after every
                           pass, NN.*.diff (and coloured .diff.html) per
                           changing pass, memory-plan.html and program.txt
                           (the final listing) once compiled, index.txt and
                           index.html (links to all of them; passes, node
                           counts before/after, changed, milliseconds)
"""


def _one_limit(max_arena: int | None, max_memory: int | None) -> int | None:
    """The arena limit from --max-arena or its other name --max-memory (as
    `exirc run` spells it); both may be given only if they agree."""
    if max_arena is not None and max_memory is not None and max_arena != max_memory:
        raise UsageError(f"--max-arena ({max_arena} bytes) and --max-memory ({max_memory} "
                         "bytes) are the same limit with two different values",
                         hint="give one of them")
    return max_arena if max_arena is not None else max_memory


@click.command("compile", epilog=EPILOG)
@click.argument("model")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the program (default: MODEL's name with .pte); - for "
                   "stdout (not a terminal).")
@click.option("--example-inputs", type=click.Path(dir_okay=False),
              help="Example inputs (.pt tuple, .npy or .npz) for a TorchScript archive.")
@click.option("--target", default=DEFAULT_TARGET, show_default=True,
              help=f"What to compile for: {', '.join(builtin_targets())} (portable runs on "
                   "ExecuTorch too; xnnpack delegates what XNNPACK runs, for ExecuTorch's "
                   "XNNPACK backend; xnnpack-llm also binds KV-cache attention to "
                   "ExecuTorch's llama ops; exirc adds exirc's fused ops).")
@click.option("--pipeline", "pipeline_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A pipeline YAML replacing the target's default.")
@click.option("--print-pipeline", is_flag=True, help="Print the resolved pipeline and exit.")
@click.option("--print-ir-after-all", is_flag=True, help="Print the graph after every pass.")
@click.option("--print-ir-after-change", is_flag=True,
              help="Print the graph after each pass that changed it.")
@click.option("--print-ir-diff", is_flag=True,
              help="Print a unified diff of the graph for each pass that changed it.")
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write the captured graph, the graph after every pass, a diff per "
                   "changing pass (text and coloured HTML), the memory plan, the final "
                   "listing and an index (index.txt, index.html) to this directory.")
@click.option("--max-arena", "max_arena", metavar="SIZE", callback=size_option,
              help="Fail if a method's planned memory arena needs more than SIZE. "
                   + SIZE_HELP)
@click.option("--max-memory", "max_memory", metavar="SIZE", callback=size_option,
              help="The same as --max-arena, under the name `exirc run` gives its limit.")
@click.option("--verify", is_flag=True,
              help="Run the program and eager PyTorch on the example inputs and fail (exit "
                   "code 5, no file) if their outputs differ.")
@click.option("--verify-inputs", "verify_inputs", multiple=True, metavar="FILE.npz",
              type=click.Path(dir_okay=False),
              help="Inputs for --verify and --bundle instead of the example inputs: a .npz "
                   "per case (repeatable); with --quantize, the accuracy is measured on them "
                   "(inputs the calibration did not see).")
@click.option("--rtol", type=float, default=None,
              help="Relative tolerance of --verify and bundled cases, for every dtype "
                   "(default 1e-4; float16 1e-3, bfloat16 1.6e-2).")
@click.option("--atol", type=float, default=None,
              help="Absolute tolerance of --verify and bundled cases, for every dtype "
                   "(default 1e-5).")
@click.option("--bundle", is_flag=True,
              help="Store the inputs and eager outputs in the program as test cases for "
                   "`exirc run --check`.")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Import a module (name or .py path) that registers kernels, e.g. for "
                   "custom operators; pass the same to `exirc run`.")
@click.option("--import", "imports", multiple=True, metavar="MODULE",
              help="Import a module (name or .py path) before loading the model, e.g. "
                   "transformers.modeling_outputs for a .pt2 whose outputs are its types "
                   "(repeatable).")
@click.option("--quantize", type=click.Choice(["int8", "int8-weight-only", "int4-weight-only",
                                              "8da4w", "8da8w"]),
              default=None,
              help="Quantize before compiling: int8 (static: per-channel weights and "
                   "per-tensor activations of conv/linear, calibrated), or the weight-only "
                   "modes for language models (linear and embedding weights, group-wise "
                   "scales), or 8da4w / 8da8w (linear layers: int8 activations quantized "
                   "per token at run time, int4 weights per group or int8 per channel). "
                   "Prints weight bytes and accuracy against the float model.")
@click.option("--calibration-inputs", "calibration_inputs", multiple=True, metavar="FILE.npz",
              type=click.Path(dir_okay=False),
              help="Inputs to calibrate --quantize int8 on and measure accuracy with, a .npz "
                   "per case as --verify-inputs takes them (default: the example inputs).")
@click.option("--min-sqnr", "min_sqnr", type=float, default=None, metavar="DB",
              help="Warn (stderr, and `warnings` in --json) when an output's SQNR against the "
                   "float model is below DB (default 20; measured on --verify-inputs when "
                   "given, else the calibration inputs).")
@click.option("--group-size", type=int, default=None,
              help="Values per scale of the weight-only modes and 8da4w (default: per "
                   "channel for int8, 128 for int4, 32 for 8da4w; rows it does not divide "
                   "get one scale per channel).")
@click.option("--quantize-embeddings", "quantize_embeddings",
              type=click.Choice(["none", "int8", "int4"]), default=None,
              help="With int8, 8da4w or 8da8w: embedding tables as int8 (a scale per row) or "
                   "int4 (groups of 128) rows. Their lookups need ExecuTorch's quantized "
                   "kernel library outside the delegates; none keeps them float. Default: "
                   "int8 rows for --quantize int8 on a target without delegates, else none.")
@click.option("--external-weights", "external_weights", metavar="FILE.ptd",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Write the weights (constants, and delegates' weights) to this data file "
                   "instead of the program, in ExecuTorch's .ptd format; run the program "
                   "with `exirc run --data FILE.ptd` (ExecuTorch: data_path=).")
@click.option("--explain-delegation", type=click.Choice(["text", "full", "json"]),
              is_flag=False, flag_value="text", default=None,
              help="Print what was delegated and, one line per reason and op with counts, "
                   "what was left on the interpreter (methods that read the same once); "
                   "=full lists every partition and every node, =json is for programs.")
@click.option("--time-passes", is_flag=True, help="Print a table of pass timings.")
@click.option("--json", "as_json", is_flag=True,
              help="Print what was made as JSON on stdout (format exirc.compile: output, "
                   "file and segment sizes, arena and its lower bound, stage times, "
                   "verification), or a JSON error object on failure.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@click.option("-v", "--verbose", is_flag=True, help="Print more (per-method details).")
def compile_command(model: str, output: Path | None, example_inputs: str | None, target: str,
                    pipeline_file: Path | None, print_pipeline: bool,
                    print_ir_after_all: bool, print_ir_after_change: bool,
                    print_ir_diff: bool, dump_dir: Path | None, max_arena: int | None,
                    max_memory: int | None,
                    verify: bool, verify_inputs: tuple[str, ...], rtol: float | None,
                    atol: float | None, bundle: bool, plugins: tuple[str, ...],
                    imports: tuple[str, ...], quantize: str | None,
                    calibration_inputs: tuple[str, ...], min_sqnr: float | None,
                    group_size: int | None, quantize_embeddings: str | None,
                    external_weights: Path | None,
                    explain_delegation: str | None,
                    time_passes: bool, as_json: bool, quiet: bool, verbose: bool) -> None:
    """Compile MODEL to a .pte program."""
    from exirc.pipelines import load_pipeline

    _check_input_files(model, example_inputs, pipeline_file, verify_inputs,
                       calibration_inputs, plugins + imports)
    if print_pipeline:
        click.echo(load_pipeline(target, pipeline_file).describe(), nl=False)
        return

    from exirc.compiler import CompileOptions, compile_model
    # torch's and the compiler's long-lived objects (about a million) stay to the end of
    # the command: frozen, the garbage collector stops walking them again in every full
    # collection of the compile (7-10% of its time).
    gc.freeze()
    if (rtol is not None or atol is not None) and not (verify or bundle):
        raise UsageError("--rtol and --atol apply to --verify and --bundle",
                         hint="add --verify")
    output = output or Path(model.split(":")[0]).with_suffix(".pte")
    to_stdout = is_stdio(output)
    # Before any compile work: a compile that cannot be saved is minutes wasted.
    if as_json and explain_delegation is not None:
        raise UsageError("--json and --explain-delegation both write to stdout",
                         hint="give one of them")
    if to_stdout:
        for flag, given in (("--explain-delegation", explain_delegation), ("--json", as_json)):
            if given:
                raise UsageError(f"-o - and {flag} both write to stdout",
                                 hint="write the program to a file with -o FILE")
        refuse_terminal_stdout("the program")
    else:
        check_output_path(output, "program")
    if dump_dir is not None:
        check_output_directory(dump_dir, "--dump-dir directory")
    if external_weights is not None:
        _check_data_path(external_weights, None if to_stdout else output)
    options = CompileOptions(target=target, pipeline=pipeline_file,
                             print_ir_after_all=print_ir_after_all,
                             print_ir_after_change=print_ir_after_change,
                             print_ir_diff=print_ir_diff, dump_dir=dump_dir,
                             max_arena_bytes=_one_limit(max_arena, max_memory),
                             verify=verify,
                             verify_inputs=verify_inputs,
                             rtol=rtol, atol=atol, bundle=bundle, quantize=quantize,
                             calibration_inputs=calibration_inputs,
                             quantize_group_size=group_size, min_sqnr_db=min_sqnr,
                             quantize_embeddings=quantize_embeddings,
                             external_weights=external_weights,
                             on_stage=stage_printer() if wants_progress(
                                 sys.stderr, quiet=quiet, as_json=as_json) else None)
    for plugin in plugins:  # kernels it registers pass the kernel check (and run --verify)
        import_plugin(plugin)
    for module in imports:  # e.g. the pytree types a .pt2's outputs are made of
        import_plugin(module, "module given to --import")
    with warnings.catch_warnings():
        # torch's own deprecation chatter is not the user's business; exirc's
        # warnings arrive through `warn`. -v keeps everything.
        if not verbose:
            warnings.simplefilter("ignore")
        result = compile_model(model, options, example_inputs_path=example_inputs,
                               warn=lambda message: click.echo(f"warning: {message}", err=True))
    if to_stdout:
        if result.external_data is not None and external_weights is not None:
            write_atomically(external_weights, result.external_data)
        write_stdout(result.data)
    else:
        result.save(output)  # the data file too, first
    report = result.report
    if explain_delegation == "json":
        click.echo(explain_json(result.delegation), nl=False)
    elif explain_delegation is not None:
        click.echo(explain_text(result.delegation, full=explain_delegation == "full"),
                   nl=False)
        click.echo("".join(f"{line}\n" for line in
                           attention_lines(result.planned, summary=False)), nl=False)
    if time_passes and report.instrument is not None:
        click.echo(report.instrument.timing_table(), err=True)
    if as_json:
        from exirc.cli.json_output import compile_body, write_document

        write_document("compile", compile_body(result, str(output)))
        return
    if quiet:
        return
    stages = " | ".join(f"{name} {seconds:.2f} s" for name, seconds in
                        report.stage_seconds.items())
    lines = [
        f"compiled {model} -> {'stdout' if to_stdout else output} "
        f"({human_bytes(report.file_bytes)}), target {target}",
        f"  stages: {stages}",
        f"  {report.instructions} instructions, {report.kernel_calls} kernel calls",
        f"  {memory_text(working_arenas(result.program))} (as `exirc inspect --show memory`)",
        f"  constants {human_bytes(report.constant_bytes)}"
        + (f", state {human_bytes(report.state_bytes)} (buffers the model updates, kept from "
           "run to run)" if report.state_bytes else ""),
    ]
    if result.external_data is not None:
        lines.append(f"  weights in {external_weights} ({human_bytes(len(result.external_data))}"
                     "): run with --data, as ExecuTorch's runtime takes data_path")
    if result.quantization is not None:
        lines.extend(quantization_lines(result.quantization))
    delegated = summary_line(result.delegation)
    if delegated:
        lines.append(delegated)
    lines.extend(attention_lines(result.planned, summary=True))
    if verbose:
        for plan in result.program.execution_plan:
            ops = sorted({op.qualified_name for op in plan.operators})
            lines.append(f"  method {plan.name}: {len(plan.values)} values, "
                         f"{len(ops)} operators: {', '.join(ops)}")
    if result.bundled_cases:
        count = result.bundled_cases
        lines.append(f"  bundled {count} test case{'s' if count != 1 else ''} "
                     "(check with `exirc run --check`)")
    if result.verification is not None:
        lines.append(f"verified: {result.verification.summary()}")
    click.echo("\n".join(lines), file=sys.stderr)


def _check_data_path(data: Path, program: Path | None) -> None:
    """--external-weights must be a writable file other than the program."""
    check_output_path(data, "--external-weights data file")
    if program is not None and os.path.abspath(data) == os.path.abspath(program):
        raise UsageError(f"--external-weights {data} is the program's own path",
                         hint="give the data file its own name, e.g. model.ptd")


def _check_input_files(model: str, example_inputs: str | None, pipeline_file: Path | None,
                       verify_inputs: tuple[str, ...], calibration_inputs: tuple[str, ...],
                       plugins: tuple[str, ...]) -> None:
    """Refuse a FIFO or a device among the files to read, which would block the
    compile forever (or read endlessly) in the library that opens it."""
    refuse_special_file(model.split(":")[0], "model file")
    if example_inputs is not None:
        refuse_special_file(example_inputs, "example inputs file")
    if pipeline_file is not None:
        refuse_special_file(pipeline_file, "pipeline file")
    for path in verify_inputs:
        refuse_special_file(path, "--verify-inputs file")
    for path in calibration_inputs:
        refuse_special_file(path, "--calibration-inputs file")
    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin:
            refuse_special_file(plugin, "plugin file")
