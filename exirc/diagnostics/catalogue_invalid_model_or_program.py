"""Catalogue entries of exit code 3: an invalid model or program file.

E03xx: a malformed `.pte`, a model that cannot be loaded or exported, a graph
that breaks its dialect or memory plan, an instruction failing at run time.
Joined with the other families in `exirc.diagnostics.catalogue`.
"""

from __future__ import annotations

from exirc.diagnostics.error_doc import ErrorDoc

INVALID_MODEL_OR_PROGRAM_ERRORS: tuple[ErrorDoc, ...] = (
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
)
