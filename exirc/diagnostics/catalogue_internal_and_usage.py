"""Catalogue entries of exit codes 1 and 2: internal and usage errors.

E0000 (an ExircError without a more specific code), E0100 (a bug in exirc),
and E02xx: the command line, the inputs or a plugin is wrong. Joined with the
other families in `exirc.diagnostics.catalogue`.
"""

from __future__ import annotations

from exirc.diagnostics.error_doc import ErrorDoc

INTERNAL_AND_USAGE_ERRORS: tuple[ErrorDoc, ...] = (
    ErrorDoc(
        code="E0000",
        title="error without a more specific code",
        exit_code=1,
        raised_as="exirc.errors.ExircError",
        meaning=(
            "ExircError is the base of every error exirc raises on purpose. exirc itself "
            "always raises one of its subclasses, which have their own codes; E0000 appears "
            "only when other code (a plugin, a script built on exirc) raises the base class "
            "directly."
        ),
        causes=(
            "a plugin pass or kernel raised exirc.errors.ExircError itself",
        ),
        what_to_do=(
            "read the message: it comes from the code that raised it",
            "if you wrote that code, raise a specific subclass instead (UsageError, "
            "ModelError, ...), so users get its exit code and explanation",
        ),
        example="error[E0000]: my_plugin: table 'scales' is missing",
    ),
    ErrorDoc(
        code="E0100",
        title="internal error (a bug in exirc)",
        exit_code=1,
        raised_as="exirc.errors.InternalError",
        meaning=(
            "Something went wrong inside exirc that is not the fault of your model, file or "
            "command line: an unexpected exception, or a check of exirc's own work that "
            "failed (for example a pass that broke the contract every pass must keep). Any "
            "exception the command line does not expect is reported this way rather than as "
            "a raw traceback."
        ),
        causes=(
            "a bug in exirc's compiler, reader or interpreter",
            "a pass returned something other than a PassResult",
            "an unexpected failure of the environment (disk full while writing, for example)",
        ),
        what_to_do=(
            "rerun the same command with --debug to see the full traceback",
            "report it with the command you ran, the --debug output and, if you can, the "
            "model or program file",
            "if the message is about the environment (no space left, permission denied), fix "
            "that and retry",
        ),
        example=(
            "error[E0100]: pass broken returned ExportedProgram, not a PassResult\n"
            "  hint: this is a bug in exirc; please report it with the command you ran and "
            "--debug output"
        ),
    ),
    ErrorDoc(
        code="E0200",
        title="usage error",
        exit_code=2,
        raised_as="exirc.errors.UsageError",
        meaning=(
            "The command line or an argument of the Python API is wrong: a file that does "
            "not exist, options that cannot be combined, a value that is not allowed, or a "
            "pipeline YAML file that names an unknown stage, pass or option. Nothing was "
            "compiled or run."
        ),
        causes=(
            "a misspelt path, or an output directory that does not exist",
            "options that exclude each other, such as `exirc run --inputs x.npy --random`",
            "an unknown target, pass name, pass option or memory planning algorithm",
            "a method name the program does not have",
        ),
        what_to_do=(
            "read the hint: it usually lists the accepted values",
            "`exirc COMMAND --help` shows every option with examples",
            "for pipeline files, `exirc compile model.py --print-pipeline` prints a valid "
            "one to start from",
        ),
        example=(
            "error[E0200]: no such file: model.pte\n"
            "  hint: check the path"
        ),
    ),
    ErrorDoc(
        code="E0201",
        title="inputs do not fit the method",
        exit_code=2,
        raised_as="exirc.errors.InputError",
        meaning=(
            "The inputs given to a program (`exirc run --inputs`, or `program.run(...)`) do "
            "not match the method's signature, or an input file cannot be read. Inputs are "
            "checked before anything runs: the count, each input's dtype, rank and shape "
            "(for a dynamic dimension, its upper bound), and the .npy/.npz files themselves."
        ),
        causes=(
            "too many or too few inputs",
            "a float64 array where the method takes float32 (numpy's default is float64)",
            "a shape that differs from the one the model was exported with, or a dynamic "
            "dimension beyond its maximum",
            "a .npz archive whose keys are not the method's input names",
            "a truncated, corrupt or unsupported .npy/.npz file",
        ),
        what_to_do=(
            "`exirc inspect PROGRAM` lists each method's inputs with dtypes and shapes",
            "convert arrays with array.astype(numpy.float32) and reshape them to fit",
            "save several inputs as numpy.savez(path, input_0=..., input_1=...)",
            "`exirc run PROGRAM --random` runs the method on random inputs of the right "
            "shape, to check the program itself",
        ),
        example=(
            "error[E0201]: input_0 has shape [3, 2], expected [2, 3] (f32[2, 3])\n"
            "  hint: `exirc inspect PROGRAM` lists each method's inputs: their names, dtypes "
            "and shapes"
        ),
    ),
    ErrorDoc(
        code="E0202",
        title="a plugin failed",
        exit_code=2,
        raised_as="exirc.errors.PluginError",
        meaning=(
            "Code you supplied to exirc raised an exception: a pass named `module:attr` in a "
            "pipeline file, or a kernel or backend registered by a plugin. The failure is "
            "in that code, not in exirc, so it is reported as your error rather than as an "
            "internal one."
        ),
        causes=(
            "a bug in the plugin pass or kernel",
            "a plugin written for another version of torch or exirc",
            "a pass that assumes a graph shape the model does not have",
        ),
        what_to_do=(
            "rerun with --debug: the traceback shows the line in your plugin that raised",
            "check the pass contract in exirc/passes/contract.py: a pass takes an "
            "ExportedProgram and returns a PassResult",
        ),
        example=(
            "error[E0202]: pass raising failed: ValueError: bad plugin state\n"
            "  hint: the error is in your pass; rerun with --debug for its traceback"
        ),
    ),
)
