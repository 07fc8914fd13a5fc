"""End to end: `exirc compile --target xnnpack` and `--quantize` in each mode, through the
real command line in a process of its own (forked warm, `tests.warm_exirc`; the `make demo`
line in a fresh interpreter); each file run by `exirc run` (a process too, on the
default engine choice, `auto`) and by ExecuTorch's runtime, and both compared with a
reference exirc did not make:

- `--target xnnpack`, float: eager PyTorch, within rtol 1e-4, atol 1e-5 (`--verify`'s).
- `--quantize int8` (portable with `--calibration-inputs`; xnnpack calibrated on the
  example inputs): ExecuTorch's own quantized lowering of the same model file
  (torchao's pt2e with ExecuTorch's XNNPACKQuantizer, per-channel symmetric, calibrated
  on the same inputs in the same order; `to_edge_transform_and_lower` with
  XnnpackPartitioner), run by ExecuTorch's runtime, within two quantization steps of
  the output; and eager float, SQNR above 10 dB (a sanity bound).
- `--quantize int8-weight-only` (per channel) and `int4-weight-only --group-size 16`:
  the model in eager with each weight fake-quantized by the documented scheme
  (`_fake_quantized`), within float rounding (rtol 1e-4, atol 1e-5); and eager float:
  different by more than rounding (the weights were quantized), SQNR above 10 dB.
- `make demo`'s line `--quantize int8 --target xnnpack --verify`, read from the
  Makefile: exit 0; the file on both runtimes within one step of the softmax's input of
  ExecuTorch's own lowering, and of eager float within 0.01 on the example inputs (what
  it calibrated on); on ExecuTorch's runtime, the first bound on held-out inputs too.

Every input is drawn from a seeded generator; the held-out ones were never calibrated on.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch.fx import GraphModule

from exirc.serialize import deserialize
from tests.cli.end_to_end import (
    REPO,
    Workshop,
    eager,
    eager_model,
    exirc,
    read_npz,
    run_executorch,
    seeded,
    write_npz,
)
from tests.oracle import requires_executorch

pytestmark = [requires_executorch, pytest.mark.oracle]

HELD_OUT = 11  # the seed of the inputs every file is run on: no observer saw them
FLOAT_RTOL, FLOAT_ATOL = 1e-4, 1e-5  # --verify's, for float32
INT8_STEPS = 2  # XNNPACK's integer requantization and exirc's kernels may round one
#                 intermediate value to the neighbouring step; observed: at most one step
MIN_SQNR_DB = 10.0  # against eager float: loose, a sanity bound (the zoo tests' too)
DEMO_ATOL = 0.01  # on softmax probabilities


def _sqnr_db(got: torch.Tensor, expected: torch.Tensor) -> float:
    noise = (got - expected).pow(2).mean()
    return float(10 * torch.log10(expected.pow(2).mean() / noise))


def _assert_close(got: torch.Tensor, expected: torch.Tensor, what: str,
                  rtol: float = FLOAT_RTOL, atol: float = FLOAT_ATOL) -> None:
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol,
                               msg=lambda message: f"{what}: {message}")


def _operators(pte: Path) -> list[str]:
    (plan,) = deserialize(pte.read_bytes()).execution_plan
    return [op.name for op in plan.operators]


def _delegates(pte: Path) -> list[str]:
    (plan,) = deserialize(pte.read_bytes()).execution_plan
    return [delegate.id for delegate in plan.delegates]


# --------------------------------------------------------------------------
# --target xnnpack, float.
# --------------------------------------------------------------------------


def test_xnnpack_file_runs_like_eager_on_exirc_run_and_executorch(workshop: Workshop) -> None:
    pte, _ = workshop.compiled("cnn", "--target", "xnnpack")
    assert _delegates(pte) == ["XnnpackBackend"]
    model, _ = eager_model(workshop.model_file("cnn"))
    inputs = (seeded(HELD_OUT, 2, 3, 8, 8),)
    (expected,) = eager(model, inputs)

    (ours,) = workshop.run(pte, inputs, "--engine", "auto")
    (theirs,) = run_executorch(pte.read_bytes(), inputs)

    _assert_close(ours, expected, "exirc run vs eager")
    _assert_close(theirs, expected, "ExecuTorch's runtime vs eager")


# --------------------------------------------------------------------------
# --quantize int8: against ExecuTorch's own quantized lowering.
# --------------------------------------------------------------------------


def _executorch_int8(model: torch.nn.Module, example: tuple[torch.Tensor, ...],
                     calibration: Sequence[tuple[torch.Tensor, ...]]) -> tuple[bytes, float]:
    """ExecuTorch's own static int8 flow on the model: torchao's pt2e with ExecuTorch's
    XNNPACKQuantizer (per-channel symmetric weights, per-tensor activations), calibrated
    on `calibration` in order, lowered with XnnpackPartitioner. (file, output step: the
    scale of the dequantize that makes the output, or its float head's input)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    with torch.no_grad():
        for case in calibration:
            prepared(*case)
    converted: GraphModule = convert_pt2e(prepared)
    output = next(n for n in converted.graph.nodes if n.op == "output")
    (node,) = output.args[0]
    while "dequantize_per_tensor" not in str(node.target):  # past a float softmax
        (node,) = node.all_input_nodes
    step = float(node.args[1])  # the scale of the last dequantize
    lowered = to_edge_transform_and_lower(torch.export.export(converted, example),
                                          partitioner=[XnnpackPartitioner()])
    return bytes(lowered.to_executorch().buffer), step


@pytest.mark.parametrize(("name", "target", "calibrated_on"), [
    ("mlp", "portable", "files"),  # --calibration-inputs: three .npz files
    ("cnn", "xnnpack", "example"),  # the example inputs
])
def test_int8_equals_executorchs_own_quantized_lowering(workshop: Workshop, tmp_path: Path,
                                                        name: str, target: str,
                                                        calibrated_on: str) -> None:
    model, example = eager_model(workshop.model_file(name))
    shape = example[0].shape
    flags = ["--quantize", "int8", "--target", target]
    if calibrated_on == "files":
        calibration = [(seeded(seed, *shape),) for seed in (1, 2, 3)]
        for i, case in enumerate(calibration):
            path = write_npz(workshop.directory / f"{name}.calibration.{i}.npz", case)
            flags += ["--calibration-inputs", str(path)]
    else:
        calibration = [example]
    pte, err = workshop.compiled(name, *flags)
    layers = {"mlp": 2, "cnn": 3}[name]
    assert f"quantized int8: {layers} conv/linear layers, calibrated on " in err, err
    if target == "xnnpack":
        assert _delegates(pte) == ["XnnpackBackend"]
    else:
        assert "quantized_decomposed::quantize_per_tensor" in _operators(pte)
    reference, step = _executorch_int8(model, example, calibration)
    inputs = (seeded(HELD_OUT, *shape),)
    (expected,) = run_executorch(reference, inputs)

    (ours,) = workshop.run(pte, inputs, "--engine", "auto")
    (theirs,) = run_executorch(pte.read_bytes(), inputs)

    for got, runtime in [(ours, "exirc run"), (theirs, "ExecuTorch's runtime")]:
        worst = float((got - expected).abs().max())
        assert worst <= INT8_STEPS * step * (1 + 1e-4), (
            f"{name} int8 on {target}, {runtime}: differs from ExecuTorch's own quantized "
            f"lowering by {worst:.3g}, more than {INT8_STEPS} steps of {step:.3g}")
    (floating,) = eager(model, inputs)
    sqnr = _sqnr_db(ours, floating)
    assert sqnr > MIN_SQNR_DB, f"{name} int8 on {target}: SQNR {sqnr:.1f} dB against float"


# --------------------------------------------------------------------------
# --quantize int8-weight-only / int4-weight-only: against fake-quantized eager.
# --------------------------------------------------------------------------


def _fake_quantized(model: torch.nn.Module, bits: int, group_size: int | None
                    ) -> torch.nn.Module:
    """The model with every linear and embedding weight quantized and dequantized in
    eager, by docs/quantization.md's scheme (exirc/quantize/weight_only.py implements
    it): symmetric, a scale per group of `group_size` values along each row (the
    reduction axis; a whole row when the group is None or does not divide it), the
    scale the group's largest magnitude over 2**(bits-1) - 1, values rounded and
    clamped to [-2**(bits-1), 2**(bits-1) - 1]. Biases stay float."""
    largest = 2 ** (bits - 1) - 1
    quantized = copy.deepcopy(model)
    with torch.no_grad():
        for module in quantized.modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                continue
            rows, columns = module.weight.shape
            size = group_size if group_size and columns % group_size == 0 else columns
            groups = module.weight.reshape(rows, columns // size, size)
            scales = groups.abs().amax(dim=-1, keepdim=True) / largest
            values = torch.round(groups / scales).clamp(-largest - 1, largest)
            module.weight.copy_((values * scales).reshape(rows, columns))
    return quantized


@pytest.mark.parametrize(("mode", "target", "group_size", "stored"), [
    ("int8-weight-only", "portable", None, "group size 32, 64"),  # per output channel
    ("int4-weight-only", "xnnpack", None, "group size 32, 64"),  # per channel: in XNNPACK
])
def test_weight_only_equals_the_fake_quantized_model(workshop: Workshop, mode: str,
                                                     target: str, group_size: int | None,
                                                     stored: str) -> None:
    flags = ["--quantize", mode, "--target", target]
    if group_size is not None:
        flags += ["--group-size", str(group_size)]
    pte, err = workshop.compiled("tiny_lm", *flags)
    assert f"quantized {mode}: 3 weight tables ({stored})" in err, err
    model, _ = eager_model(workshop.model_file("tiny_lm"))
    bits = 8 if mode.startswith("int8") else 4
    reference = _fake_quantized(model, bits, group_size)
    ids = (torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(HELD_OUT)),)
    (expected,) = eager(reference, ids)

    (ours,) = workshop.run(pte, ids, "--engine", "auto")
    (theirs,) = run_executorch(pte.read_bytes(), ids)

    _assert_close(ours, expected, f"{mode} on {target}: exirc run vs fake-quantized eager")
    _assert_close(theirs, expected, f"{mode} on {target}: ExecuTorch vs fake-quantized eager")
    (floating,) = eager(model, ids)
    assert not torch.allclose(ours, floating, rtol=FLOAT_RTOL, atol=FLOAT_ATOL), \
        "the weights stayed float"
    sqnr = _sqnr_db(ours, floating)
    assert sqnr > MIN_SQNR_DB, f"{mode} on {target}: SQNR {sqnr:.1f} dB against float"


# --------------------------------------------------------------------------
# `make demo`'s quantized line.
# --------------------------------------------------------------------------


def _demo_line() -> list[str]:
    """The arguments of the Makefile's `--quantize int8 --target xnnpack --verify` line."""
    lines = [line.split() for line in (REPO / "Makefile").read_text().splitlines()
             if line.startswith("\t$(EXIRC) compile ") and "--quantize" in line]
    assert len(lines) == 1, lines
    return lines[0][1:]


def test_the_make_demo_quantized_line(tmp_path: Path) -> None:
    args = _demo_line()
    assert shlex.join(args[:-1]) == ("compile examples/mlp.py --quantize int8 --target xnnpack "
                                     "--verify -o"), args
    pte = tmp_path / "mlp_int8.pte"

    # From the repository, as make runs it, in a fresh interpreter as a user's.
    done = exirc(*args[:-1], str(pte), cwd=REPO, real=True)

    assert done.returncode == 0, done.stderr
    assert "verified: 1 output matches" in done.stderr, done.stderr
    assert _delegates(pte) == ["XnnpackBackend"]
    model, example = eager_model(REPO / "examples" / "mlp.py")
    reference, step = _executorch_int8(model, example, [example])
    # Softmax moves no probability by more than half the largest change of its input:
    # two steps of the logits are at most one step of the output.
    near_reference = step * INT8_STEPS / 2 * (1 + 1e-4)
    npz = write_npz(tmp_path / "inputs.npz", example)
    ran = exirc("run", str(pte), "--inputs", str(npz), "-o", str(tmp_path / "out.npz"),
                "--engine", "auto")
    assert ran.returncode == 0, ran.stderr
    (ours,) = [torch.from_numpy(a) for a in read_npz(tmp_path / "out.npz")]
    (floating,) = eager(model, example)
    held_out = (seeded(HELD_OUT, 2, 16),)
    for got, runtime, inputs in [(ours, "exirc run", example),
                                 (run_executorch(pte.read_bytes(), example)[0],
                                  "ExecuTorch's runtime", example),
                                 (run_executorch(pte.read_bytes(), held_out)[0],
                                  "ExecuTorch's runtime on held-out inputs", held_out)]:
        (expected,) = run_executorch(reference, inputs)
        _assert_close(got, expected, f"{runtime} vs ExecuTorch's lowering", rtol=0,
                      atol=near_reference)
        if inputs is example:  # what it calibrated on: near float (held-out inputs beyond
            #                    that range are clipped, by ExecuTorch's lowering as much)
            _assert_close(got, floating, f"{runtime} vs eager float", rtol=0, atol=DEMO_ATOL)
