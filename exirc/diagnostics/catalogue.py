"""Every error code exirc uses, explained: the one place the codes are documented.

Each `ExircError` class has a stable code (`exirc.errors`); the CLI prints it
as `error[E0300]: ...` and `exirc explain E0300` prints the entry here. A
test checks this table against the error classes in both directions, so a
new error class cannot ship without its explanation, and an entry cannot
outlive its class.

Codes are grouped by their hundreds, which follow the exit codes: E01xx
internal, E02xx usage, E03xx invalid model or program, E04xx unsupported
operator, E05xx verification mismatch.

This module is data only: it imports nothing from the compiler, so looking
a code up never imports torch.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# What each process exit code means (also in README.md and exirc/errors.py).
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "internal error",
    2: "usage error",
    3: "invalid model or program file",
    4: "unsupported operator",
    5: "verification mismatch",
}


@dataclass(frozen=True)
class ErrorDoc:
    """The documentation of one error code."""

    code: str
    title: str
    exit_code: int
    raised_as: str  # the class to catch in Python, e.g. "exirc.errors.FormatError"
    meaning: str
    causes: tuple[str, ...]
    what_to_do: tuple[str, ...]
    example: str  # what the CLI prints, error line and hint

    @property
    def class_name(self) -> str:
        return self.raised_as.rsplit(".", 1)[-1]


_DOCS = (
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
    ErrorDoc(
        code="E0300",
        title="invalid program file",
        exit_code=3,
        raised_as="exirc.errors.FormatError",
        meaning=(
            "A .pte file is malformed, or asks for something a reader must refuse. exirc "
            "treats program files as untrusted: it checks every offset, length, index and "
            "size before using it, and names the first bad field by its path in the "
            "program (for example `execution_plan[0].chains[0].instructions[3].op_index`). "
            "Limits set when loading, such as the planned-memory limit, are reported the "
            "same way."
        ),
        causes=(
            "the file is not a .pte program at all (wrong file, or not the ET12 format)",
            "the file was truncated or corrupted while copying",
            "it was written by a tool with an incompatible schema",
            "its memory plan is larger than the limit (`exirc run --max-memory`)",
        ),
        what_to_do=(
            "re-create the file with `exirc compile` (or ExecuTorch's exporter)",
            "`exirc inspect FILE` shows how far the file can be read",
            "if the file is trusted and only a limit was exceeded, raise the limit as the "
            "hint says",
        ),
        example=(
            "error[E0300]: header: file identifier is b'\\x00\\x00\\x00\\x00', expected "
            "b'ET12': not a .pte program, or one written for an incompatible schema version\n"
            "  hint: the file is not a valid .pte program; re-create it with `exirc compile`"
        ),
    ),
    ErrorDoc(
        code="E0310",
        title="model cannot be loaded or exported",
        exit_code=3,
        raised_as="exirc.errors.ModelError",
        meaning=(
            "exirc could not turn MODEL into an exported program. MODEL is a model.py "
            "(defining `model` and `example_inputs`), `model.py:factory`, a .pt2 archive or "
            "a TorchScript archive. Loading runs your model file; exporting traces the "
            "model with torch.export. When the failure comes from a line of your code, the "
            "message shows that line."
        ),
        causes=(
            "the model file has a syntax error or raises when it runs",
            "it does not define `model` or `example_inputs`, or defines them with the "
            "wrong types",
            "torch.export cannot trace the model: data-dependent control flow, unsupported "
            "Python, or dynamic shapes that conflict with the code",
            "the file is a torch.save checkpoint or a damaged archive, not a model",
            "a tensor dtype that a program cannot store",
        ),
        what_to_do=(
            "run the model eagerly first: `python model.py` should work",
            "read the hint: for export failures it names the construct to change (for "
            "example torch.cond for data-dependent branches)",
            "rerun with --debug for the whole traceback",
        ),
        example=(
            "error[E0310]: model.py:4: raise ValueError(\"no weights here\"): ValueError "
            "while running the model file: no weights here\n"
            "  hint: fix the model file; --debug shows the whole traceback"
        ),
    ),
    ErrorDoc(
        code="E0311",
        title="dynamic dimension without an upper bound",
        exit_code=3,
        raised_as="exirc.plan.lifetimes.UnboundedShapeError",
        meaning=(
            "Memory planning gives every tensor a fixed place in an arena sized for its "
            "largest possible shape. A tensor whose shape has a dynamic dimension with no "
            "maximum cannot be planned, so the compile stops and names the tensor and the "
            "dimension."
        ),
        causes=(
            "an input dimension declared dynamic with torch.export.Dim(\"name\") and no max",
            "a data-dependent size (from nonzero, unique, item, ...) that nothing bounds",
        ),
        what_to_do=(
            "give input dimensions a maximum: torch.export.Dim(\"batch\", max=64) in "
            "dynamic_shapes",
            "bound data-dependent sizes in the model with torch._check(size <= N)",
        ),
        example=(
            "error[E0311]: tensor %x of shape (s77, 3) needs planned memory, but dimension "
            "s77 has no upper bound; ...\n"
            "  hint: bound every dynamic dimension, e.g. torch.export.Dim(\"batch\", max=64)"
        ),
    ),
    ErrorDoc(
        code="E0312",
        title="planned memory over the --max-arena limit",
        exit_code=3,
        raised_as="exirc.plan.limits.ArenaLimitError",
        meaning=(
            "`exirc compile --max-arena SIZE` sets a budget for each method's planned memory "
            "arena (the activations and intermediate tensors, not the weights). After memory "
            "planning, a method whose arena is bigger fails the compile, and no file is "
            "written. The message gives the arena, the limit, the lower bound (the most bytes "
            "alive at one moment, which no plan can beat) and the largest planned tensors with "
            "the source lines that made them."
        ),
        causes=(
            "dynamic dimensions with generous maximums: tensors are planned at their upper "
            "bounds",
            "large intermediate tensors (attention scores, wide hidden layers) alive at once",
            "a limit below the lower bound, which no memory plan can meet",
        ),
        what_to_do=(
            "lower the maximums of batch or sequence dimensions in dynamic_shapes",
            "restructure the model around the largest tensors listed",
            "if the lower bound fits but the plan does not, try another planning algorithm "
            "in the pipeline's memory_plan options",
            "if the device has the memory, raise --max-arena",
        ),
        example=(
            "error[E0312]: method 'forward' needs a memory arena of 256 bytes, over the limit "
            "of 64 bytes (lower bound 256 bytes); largest planned tensors: %addmm [2, 16] "
            "float32 128 bytes at model.py:9: return torch.relu(self.fc(x)), ...\n"
            "  hint: no plan fits: even the lower bound (the most bytes live at once) is over "
            "it; reduce batch/sequence bounds (the largest tensors are listed), or raise "
            "--max-arena"
        ),
    ),
    ErrorDoc(
        code="E0320",
        title="dtypes an Edge op does not accept",
        exit_code=3,
        raised_as="exirc.edge.dtypes.EdgeDtypeError",
        meaning=(
            "The Edge verifier checks each operator's input and output dtypes against the "
            "combinations its kernels support (exirc/edge/dtype_constraints.yaml, measured "
            "from torch). A node with a combination outside that table, or an operator "
            "with no table entry, is refused. The message names the node, its dtypes, the "
            "source line, and the nearest allowed combinations."
        ),
        causes=(
            "a pass (often a plugin pass) changed a node's dtype, or built a node with "
            "mismatched dtypes",
            "the model mixes dtypes in a way an operator does not support",
            "an operator outside the Edge op set survived decomposition",
        ),
        what_to_do=(
            "cast inputs in the model with .to(dtype) to an allowed combination",
            "if a pass made the node, fix the pass; `exirc compile --print-ir-after-all` "
            "shows which one",
            "`exirc explain E0330` covers operators that are not Edge ops at all",
        ),
        example=(
            "error[E0320]: node %mul: aten::mul.Tensor does not accept dtypes (self: Float, "
            "other: Float, __ret_0: Long) at model.py:5: return x * y; ...\n"
            "  hint: cast the inputs (`.to(dtype)`) to a supported combination, or fix the "
            "pass that made this node"
        ),
    ),
    ErrorDoc(
        code="E0330",
        title="graph breaks its dialect",
        exit_code=3,
        raised_as="exirc.errors.DialectError",
        meaning=(
            "After each stage of the pipeline (aten, edge, backend, plan) a verifier checks "
            "that the graph keeps that dialect's rules: ATen graphs are well formed, Edge "
            "graphs hold only core ATen ops on tensors (plus custom ops and ops with no "
            "decomposition that a kernel runs), backend graphs only those and registered "
            "backend ops. This is an error in a pass or a pipeline, not in the model: an "
            "operator the model uses that nothing can run is E0401. The first node that "
            "breaks a rule is reported with its source line."
        ),
        causes=(
            "a custom pipeline dropped or reordered a pass the next stage relies on "
            "(to_edge, views_to_copies, sym_prims), leaving an op that to_edge decomposes "
            "or a view",
            "a plugin pass inserted a non-core op, a view, a Python call or a scalar-valued "
            "node",
        ),
        what_to_do=(
            "compare your pipeline with `exirc compile model.py --print-pipeline`",
            "`exirc compile --print-ir-after-all` shows the graph after every pass, to find "
            "the one that made the node",
        ),
        example=(
            "error[E0330]: node %linear (aten.linear.default) at model.py:11: "
            "return self.fc2(torch.relu(self.fc1(x))) is not an Edge op\n"
            "  hint: the to_edge pass decomposes it into core ATen ops: run to_edge before, "
            "and check that no later pass made this node (`exirc compile "
            "--print-ir-after-all`)"
        ),
    ),
    ErrorDoc(
        code="E0340",
        title="an instruction failed at run time",
        exit_code=3,
        raised_as="exirc.runtime.errors.ExecutionError",
        meaning=(
            "While a method ran, a kernel raised on the values it was given. The program "
            "loaded and its inputs matched the signature, but an instruction could not "
            "execute. The message names the instruction, its operator, the method and, "
            "when the program records it, the model's source line."
        ),
        causes=(
            "a program whose tensor sizes do not agree with each other (a hand-edited or "
            "miscompiled file)",
            "values at run time that the model never saw when it was exported, such as an "
            "index out of range",
            "a plugin kernel that fails on these arguments",
        ),
        what_to_do=(
            "rerun with --debug for the kernel's own traceback",
            "`exirc inspect PROGRAM --show instructions` lists the instructions and their "
            "arguments",
            "check that the model works eagerly on the same inputs",
        ),
        example=(
            "error[E0340]: while executing instruction 0 (aten::add.out) of method 'forward': "
            "RuntimeError: The size of tensor a (3) must match the size of tensor b (2) at "
            "non-singleton dimension 1 (from model.py:12 in forward: return x + self.w)\n"
            "  hint: the program, or the inputs it was given, do not fit this operator; "
            "rerun with --debug for the kernel's own traceback"
        ),
    ),
    ErrorDoc(
        code="E0341",
        title="step limit reached",
        exit_code=3,
        raised_as="exirc.runtime.errors.StepLimitError",
        meaning=(
            "A method ran more instructions than its step budget. Programs can jump, so a "
            "malformed or hostile file can loop forever; the interpreter stops it instead "
            "of hanging."
        ),
        causes=(
            "a loop whose condition is never met for these inputs",
            "a malformed program whose jumps form a cycle",
            "a legitimately long loop with a budget set too low",
        ),
        what_to_do=(
            "check the inputs that control the loop",
            "if the program really runs this long, raise the limit: `exirc run --max-steps "
            "N`, or load(..., max_steps=N)",
        ),
        example=(
            "error[E0341]: method 'forward' did not finish within 5 instructions (the step "
            "limit); it was about to run instruction 6 of chain 0: a loop that does not end?\n"
            "  hint: if the program really loops this long, raise the limit "
            "(`exirc run --max-steps N`, or `load(..., max_steps=N)`)"
        ),
    ),
    ErrorDoc(
        code="E0400",
        title="unsupported operator",
        exit_code=4,
        raised_as="exirc.errors.UnsupportedOperatorError",
        meaning=(
            "An operator, or a feature a program uses, has no implementation where it is "
            "needed. When compiling: the target's kernel library has no kernel for an "
            "operator, or an operator has no out-variant to write into planned memory. "
            "When loading: a kernel or delegate backend is not registered, or the program "
            "uses an element type or external data the interpreter cannot handle. All "
            "missing operators are listed together."
        ),
        causes=(
            "the model uses an operator the chosen --target does not cover",
            "the program calls custom kernels or a delegate backend that nothing registered",
            "quantized element types, or constants stored outside the program file",
        ),
        what_to_do=(
            "try `exirc compile --target exirc`, or rewrite the model with supported "
            "operators",
            "register missing kernels with exirc.runtime.register_kernel (or backends "
            "with register_backend) in a module passed to `exirc run --plugin` (and to "
            "`exirc compile --plugin`, so the kernel check knows them)",
            "`exirc inspect PROGRAM` lists the operators a program needs",
        ),
        example=(
            "error[E0400]: target 'portable' cannot run 1 op: aten::avg_pool3d.out (no "
            "kernel): %avg_pool3d at model.py:5: return ...\n"
            "  hint: use --target exirc, or register a backend op with a kernel for it, or "
            "decompose it into supported ops"
        ),
    ),
    ErrorDoc(
        code="E0401",
        title="operator not supported: no kernel and no decomposition",
        exit_code=4,
        raised_as="exirc.errors.OperatorNotSupportedError",
        meaning=(
            "The model calls an operator outside the Edge op set (core ATen) that nothing "
            "can run: a custom operator (torch.library.custom_op, TORCH_LIBRARY) with no "
            "kernel registered, or an ATen operator that has no decomposition into core "
            "ATen and no kernel on the target. The compiler keeps such an operator as the "
            "model calls it when a kernel exists, the target's or one a --plugin module "
            "registers; otherwise it names the operator, the source line and module of "
            "every use, and the kernel that would run it. Every such operator is listed "
            "together."
        ),
        causes=(
            "a custom operator, compiled without the --plugin module that registers its "
            "kernel",
            "an ATen operator such as torch.special.erfinv or torch.cumprod, which the "
            "target has no kernel for and which does not decompose into operators it has",
        ),
        what_to_do=(
            "register the named kernel with exirc.runtime.register_kernel in a module, and "
            "pass it with --plugin to both `exirc compile` and `exirc run`",
            "for a custom operator, the kernel is for its .out overload if it defines one "
            "(then ExecuTorch's runtime can run the program too, given the kernel), else "
            "for the operator itself: a functional kernel whose result exirc copies into "
            "planned memory",
            "or change the model to compute the same with supported operators",
        ),
        example=(
            "error[E0401]: operator aten::erfinv is not supported: target 'portable' has no "
            "kernel for it (aten::erfinv.out), and it has no decomposition into core ATen "
            "ops; used at model.py:6: return torch.special.erfinv(x) [%erfinv, module "
            "'block' (Block)]\n"
            "  hint: register a kernel for aten::erfinv.out (exirc.runtime.register_kernel) "
            "in a module you pass with --plugin to both `exirc compile` and `exirc run`, or "
            "change the model to avoid it"
        ),
    ),
    ErrorDoc(
        code="E0500",
        title="outputs differ from the reference",
        exit_code=5,
        raised_as="exirc.errors.VerificationError",
        meaning=(
            "A compiled program was checked against a reference and at least one output "
            "differs by more than the tolerance: `exirc compile --verify` compares it with "
            "the eager model on the example inputs (or --verify-inputs), `exirc run --check` "
            "with the expected outputs bundled in the file by `--bundle`. The program runs, "
            "but computes something else. --verify then names the first instruction whose "
            "result diverges from torch's own kernels, with its op, graph node, source line "
            "and module; if every instruction agrees, it names the first graph node a pass "
            "changed. Nothing is written when --verify fails."
        ),
        causes=(
            "a kernel that computes something else than torch's for these inputs (a plugin's "
            "kernel, or an interpreter bug)",
            "a pass that changed the model's numerics (a wrong rewrite or fusion)",
            "with run --check: the program or its kernels changed since the cases were "
            "bundled",
            "a tolerance too tight for the dtype (float16 and bfloat16 need looser ones)",
        ),
        what_to_do=(
            "read the first diverging instruction and its source line in the message",
            "for a pass, `exirc compile --print-ir-diff` shows what each pass changed; a "
            "pipeline without the optional passes (constant_fold, fuse) narrows it down",
            "if the difference is rounding, loosen the tolerance (--rtol, --atol)",
        ),
        example=(
            "error[E0500]: method 'forward' differs from eager PyTorch on the example inputs "
            "(rtol 0.0001, atol 1e-05)\n"
            "    output_0: max abs error 0.25 (rel 0.5) at [1, 2]: got 0.75, expected 0.5; "
            "3 of 8 elements differ\n"
            "    first diverging instruction: 1 aten::relu.out (node %relu)\n"
            "    source: model.py:12: return torch.relu(self.fc(x))\n"
            "    module: block (Block)"
        ),
    ),
)

CATALOGUE: dict[str, ErrorDoc] = {doc.code: doc for doc in _DOCS}

_CODE = re.compile(r"^E?(\d{1,4})$", re.IGNORECASE)


def normalize_code(text: str) -> str | None:
    """`E0304`, `e0304`, `0304` and `304` all mean E0304; None if `text` is not a code."""
    match = _CODE.match(text.strip())
    return f"E{int(match.group(1)):04d}" if match else None


def lookup(text: str) -> ErrorDoc | None:
    """The entry for a code (in any spelling) or an error class name, or None."""
    code = normalize_code(text)
    if code is not None:
        return CATALOGUE.get(code)
    wanted = text.strip().lower()
    return next((doc for doc in _DOCS if doc.class_name.lower() == wanted), None)


def closest_codes(text: str, count: int = 3) -> list[str]:
    """The known codes nearest to `text`, nearest first, for "did you mean" messages.

    A numeric code is near codes of its own family (same hundreds) first, then
    by distance: E0305 suggests E0300 and E0310 before E0201. Anything else is
    matched by spelling against codes and class names.
    """
    code = normalize_code(text)
    if code is not None:
        number = int(code[1:])
        return sorted(CATALOGUE, key=lambda known: (int(known[1:]) // 100 != number // 100,
                                                    abs(int(known[1:]) - number),
                                                    known))[:count]
    by_name = {doc.class_name.lower(): doc.code for doc in _DOCS}
    candidates = [*CATALOGUE, *by_name]
    matches = difflib.get_close_matches(text.strip().lower(), [c.lower() for c in candidates],
                                        n=count * 2, cutoff=0.5)
    found: list[str] = []
    for match in matches:
        known = by_name.get(match, match.upper())
        if known not in found:
            found.append(known)
    return found[:count]
