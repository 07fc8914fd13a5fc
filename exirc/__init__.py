"""exirc: a PyTorch-to-edge compiler driver.

The pipeline, one folder a stage: capture -> aten -> edge -> backend -> plan
-> emit -> serialize -> runtime. Shared by the stages: `ir` (graph helpers),
`passes` (the pass machinery), `targets` (what each target runs). On top:
`pipelines` (the built-in passes by name), `compiler` (the pipeline as one
function), `diagnostics`, `inspector`, and the CLI in `exirc.cli`, a thin
layer over the same functions. CONTRIBUTING.md has the import rule.

The Python API mirrors the CLI, on the same functions:

    import exirc
    result = exirc.compile(model, (x,), "model.pte", target="xnnpack", verify=True)
    program = exirc.load("model.pte")
    outputs = program.run("forward", [x])

and `exirc.compile_methods({"forward": exported_program})` compiles programs
already captured with torch.export.

Importing `exirc` must not import torch: `exirc --help`, `--version` and
`inspect` answer without it. Everything below imports what it needs when called.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from exirc.compiler import CompileOptions, CompileResult, compile_methods
    from exirc.runtime.core.loader import LoadedProgram

__version__ = "0.1.0"

__all__ = ["CompileOptions", "CompileResult", "__version__", "compile", "compile_methods",
           "load"]

# What `exirc.compile` passes to a model given as a module, not as options.
_MODULE_ARGUMENTS = ("dynamic_shapes", "methods", "constant_methods")


def compile(model: torch.nn.Module | str | os.PathLike[str],
            example_inputs: tuple[Any, ...] | str | os.PathLike[str] | None = None,
            output: str | os.PathLike[str] | None = None, *, target: str | None = None,
            **options: Any) -> CompileResult:
    """Compile a model to a `.pte` program, as `exirc compile` does.

    `model` is an `nn.Module` (then `example_inputs` is its tuple of inputs,
    `dynamic_shapes=` and `methods=` go to torch.export, and `constant_methods=`
    (name -> int, float, bool, str or list of ints) become methods returning
    those values, as a model file's `constant_methods`) or what the CLI takes:
    a path such as "model.py", "model.py:factory" or "model.pt2" (then
    `example_inputs` may name a .pt/.npz file for a TorchScript archive).
    `target` is as `--target`; the other keywords are `exirc.CompileOptions`
    fields, the CLI's flags: verify=True, bundle=True, quantize="int8",
    dump_dir="dump", max_arena_bytes=..., rtol=..., pipeline="passes.yaml",
    external_weights="model.ptd" (the weights go to that data file, written
    with the program), ...

    Writes the program to `output` when given (checked writable before any
    compile work); the returned `CompileResult` holds it as `.data` and
    `.program`, with `.report` and `.save(path)`. Errors are `exirc.errors`
    classes, the ones the CLI reports.
    """
    from exirc.compiler import compile_model, compile_module
    from exirc.errors import UsageError
    from exirc.serialize.files import check_output_path

    module_arguments = {name: options.pop(name) for name in _MODULE_ARGUMENTS if name in options}
    compile_options = _compile_options(target, options)
    if output is not None:
        check_output_path(output, "program")
    if compile_options.external_weights is not None:
        check_output_path(compile_options.external_weights, "external weights data file")
    if isinstance(model, (str, os.PathLike)):
        if module_arguments:
            raise UsageError(f"{', '.join(module_arguments)} apply to a model given as an "
                             "nn.Module, not to a model file",
                             hint="a model file declares its dynamic shapes and methods itself")
        if example_inputs is not None and not isinstance(example_inputs, (str, os.PathLike)):
            raise UsageError("example inputs for a model file are a .pt or .npz file's path",
                             hint="pass the nn.Module itself to give its inputs as tensors")
        inputs_path = None if example_inputs is None else os.fspath(example_inputs)
        result = compile_model(os.fspath(model), compile_options,
                               example_inputs_path=inputs_path)
    else:
        result = compile_module(_checked_module(model),
                                _checked_inputs(example_inputs), options=compile_options,
                                **module_arguments)
    if output is not None:
        result.save(os.fspath(output))
    return result


def load(source: str | os.PathLike[str] | bytes | memoryview, *,
         data: str | os.PathLike[str] | bytes | memoryview | None = None,
         **limits: Any) -> LoadedProgram:
    """Load a `.pte` program (a path, or its bytes) for running, as `exirc run` does.

    `data` is its external data file (`.ptd`, a path or its bytes), for a program
    whose weights are kept there (`exirc run --data`). The other keywords are
    `exirc.runtime.load`'s: max_memory=, max_steps=,
    max_seconds=, allow_any_aten=, kernels=, backends=, engine=, dump_engine=. Run
    with `.run("forward", [inputs])`; `.constant_methods` holds the values of the
    program's constant methods."""
    from exirc.runtime import load as load_program

    return load_program(source, data=data, **limits)


def __getattr__(name: str) -> Any:
    # The compiler's own names, imported on first use so `import exirc` stays light.
    if name in ("compile_methods", "CompileOptions", "CompileResult"):
        from exirc import compiler

        return getattr(compiler, name)
    raise AttributeError(f"module 'exirc' has no attribute {name!r}")


def _compile_options(target: str | None, options: dict[str, Any]) -> CompileOptions:
    """CompileOptions from keywords, with paths and lists as the CLI passes them."""
    import dataclasses
    from pathlib import Path

    from exirc.compiler import CompileOptions
    from exirc.errors import UsageError

    known = {field.name for field in dataclasses.fields(CompileOptions)} - {"target"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown compile option{'s' if len(unknown) > 1 else ''}: "
                         f"{', '.join(unknown)}",
                         hint=f"exirc.compile takes target= and {', '.join(sorted(known))}"
                              f" (and {' and '.join(_MODULE_ARGUMENTS)} with a module)")
    if options.get("dump_dir") is not None:
        options["dump_dir"] = Path(options["dump_dir"])
    for name in ("verify_inputs", "calibration_inputs"):
        if isinstance(options.get(name), (str, os.PathLike)):
            options[name] = (options[name],)  # one file, not its characters
        elif name in options:
            options[name] = tuple(options[name])
    if target is not None:
        options["target"] = target
    return CompileOptions(**options)


def _checked_module(model: object) -> torch.nn.Module:
    import torch

    from exirc.errors import UsageError

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"model must be a torch.nn.Module or a model file's path, got "
                         f"{type(model).__name__}",
                         hint="for a torch.export ExportedProgram, use "
                              "exirc.compile_methods({'forward': program})")
    return model


def _checked_inputs(example_inputs: object) -> tuple[Any, ...]:
    import torch

    from exirc.errors import UsageError

    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)  # the one input of a one-input model
    if not isinstance(example_inputs, (tuple, list)):
        raise UsageError("an nn.Module needs example_inputs: a tuple of its forward's inputs, "
                         f"got {type(example_inputs).__name__}",
                         hint="e.g. exirc.compile(model, (torch.randn(1, 8),))")
    return tuple(example_inputs)
