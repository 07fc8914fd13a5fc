"""Catalogue entries of exit codes 4 and 5: unsupported operators, wrong results.

E04xx: an operator or feature nothing can run; E05xx: outputs that differ from
the reference. Joined with the other families in `exirc.diagnostics.catalogue`.
"""

from __future__ import annotations

from exirc.diagnostics.error_doc import ErrorDoc

UNSUPPORTED_AND_MISMATCH_ERRORS: tuple[ErrorDoc, ...] = (
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
            "try the target the hint names (`exirc compile --target exirc` has exirc's "
            "fused ops), or rewrite the model with supported operators",
            "register missing kernels with exirc.runtime.register_kernel (or backends "
            "with register_backend) in a module passed to `exirc run --plugin` (and to "
            "`exirc compile --plugin`, so the kernel check knows them)",
            "`exirc inspect PROGRAM` lists the operators a program needs",
        ),
        example=(
            "error[E0400]: target 'portable' cannot run 1 op: aten::avg_pool3d.out (no "
            "kernel): %avg_pool3d at model.py:5: return ...\n"
            "  hint: register a backend op with a kernel for it, or decompose it into "
            "supported ops"
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
