"""Honest accuracy for `--quantize` (issue 33, items 4 and 6).

- static int8 calibrated on the example inputs alone is refused for a model that
  takes positions or a cache (E0203, naming 8da4w/8da8w and --calibration-inputs)
  and warned about for any other model;
- the accuracy is measured on --verify-inputs when given, and an output whose
  SQNR against the float model is below --min-sqnr (default 20 dB) warns on
  stderr and in --json; the SQNRs are checked against the program run here and
  the eager float model;
- `CompileResult.quantized_modules` is the quantized model in eager, per method.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy
import pytest
import torch

from exirc.cli.app import main
from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UsageError
from exirc.quantize.calibration import CalibrationError, position_or_cache
from exirc.runtime import load

REPO = Path(__file__).resolve().parents[2]

PLAIN = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 8)).eval()
example_inputs = (torch.randn(4, 16),)
"""


def _compile(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compile", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    expected, got = expected.to(torch.float64), got.to(torch.float64)
    return 10 * math.log10(float(expected.square().sum()) / float((got - expected).square().sum()))


# --------------------------------------------------------------------------
# Calibrated on the example inputs alone.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("example", ["kv_decoder.py", "tiny_llm.py"])
def test_a_decoder_is_refused_static_int8_on_its_example_inputs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, example: str) -> None:
    if example == "tiny_llm.py":
        pytest.importorskip("transformers")
    pte = tmp_path / "x.pte"
    code, out, err = _compile(capsys, str(REPO / "examples" / example), "--quantize", "int8",
                              "-o", str(pte))
    assert (code, out) == (2, ""), err
    assert "error[E0203]: method 'forward' takes positions or a cache: it writes " in err, err
    assert "--quantize 8da4w or 8da8w" in err and "--calibration-inputs" in err, err
    assert not pte.exists()


class Positional(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * input_pos.float()


class Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, positional: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + positional


def test_an_input_named_like_a_position_counts_and_a_lookalike_does_not() -> None:
    x = torch.randn(1, 8)
    named = torch.export.export(Positional().eval(), (x, torch.tensor([3])))
    assert position_or_cache(named) == "it takes an input named 'input_pos'"
    plain = torch.export.export(Plain().eval(), (x, torch.randn(1, 8)))
    assert position_or_cache(plain) is None
    with pytest.raises(CalibrationError, match="takes an input named 'input_pos'"):
        compile_module(Positional().eval(), (x, torch.tensor([3])),
                       options=CompileOptions(quantize="int8"))


def test_static_int8_on_the_example_inputs_of_another_model_warns(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(PLAIN)
    code, _, err = _compile(capsys, str(tmp_path / "plain.py"), "--quantize", "int8",
                            "-o", str(tmp_path / "x.pte"))
    assert code == 0, err
    assert ("warning: --quantize int8 is calibrated on the example inputs alone: activation "
            "ranges fit those inputs only, and the accuracy below is measured on them too"
            in err), err
    assert ("accuracy measured on example inputs (the inputs calibrated on: --verify-inputs "
            "measures on others)" in err), err


def test_calibration_files_override_the_refusal_and_the_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 8)
    calibration = tmp_path / "c.npz"
    numpy.savez(calibration, input_0=x.numpy(), input_1=numpy.array([2]))
    told: list[str] = []
    result = compile_module(Positional().eval(), (x, torch.tensor([3])),
                            options=CompileOptions(quantize="int8",
                                                   calibration_inputs=(calibration,)),
                            warn=told.append)
    assert result.quantization is not None and result.quantization.quantized_ops == 1
    assert not any("calibrated on the example inputs" in w for w in told), told


# --------------------------------------------------------------------------
# Accuracy on held-out inputs, and the SQNR threshold.
# --------------------------------------------------------------------------


def test_an_output_below_the_threshold_warns_on_held_out_inputs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import runpy

    (tmp_path / "plain.py").write_text(PLAIN)
    model = runpy.run_path(str(tmp_path / "plain.py"))["model"]
    generator = torch.Generator().manual_seed(1)
    calibrated = torch.randn(4, 16, generator=generator) * 0.05  # a narrow range ...
    held_out = torch.randn(4, 16, generator=generator) * 3  # ... that these leave far behind
    numpy.savez(tmp_path / "cal.npz", input_0=calibrated.numpy())
    numpy.savez(tmp_path / "held.npz", input_0=held_out.numpy())
    pte = tmp_path / "x.pte"

    code, out, err = _compile(capsys, str(tmp_path / "plain.py"), "--quantize", "int8",
                              "--calibration-inputs", str(tmp_path / "cal.npz"),
                              "--verify-inputs", str(tmp_path / "held.npz"),
                              "--json", "-o", str(pte))

    assert code == 0, err
    program = load(pte.read_bytes()).method("forward")
    with torch.no_grad():
        sqnr_held = _sqnr(model(held_out), torch.as_tensor(program.run([held_out])[0]))
        sqnr_calibrated = _sqnr(model(calibrated),
                                torch.as_tensor(program.run([calibrated])[0]))
    # The damage shows only on inputs the calibration did not see.
    assert sqnr_calibrated > 20 > sqnr_held, (sqnr_calibrated, sqnr_held)
    document = json.loads(out)
    quantization = document["quantization"]
    assert quantization["measured_on"] == [str(tmp_path / "held.npz")]
    assert quantization["min_sqnr_db"] == 20
    [accuracy] = quantization["accuracy"]
    assert accuracy["sqnr_db"] == pytest.approx(sqnr_held, abs=0.01)
    assert accuracy["below_min_sqnr"] is True
    [warning] = document["warnings"]
    assert warning == quantization["warnings"][0]
    assert warning.startswith(f"method 'forward' output 0: SQNR {sqnr_held:.1f} dB against the "
                              f"float model on {tmp_path / 'held.npz'}, below 20 dB "
                              "(--min-sqnr): --quantize int8 damaged it; try ")
    assert f"warning: {warning}\n" in err  # loudly, on stderr too

    # --min-sqnr under the measured value: the same program, no warning.
    code, out, err = _compile(capsys, str(tmp_path / "plain.py"), "--quantize", "int8",
                              "--calibration-inputs", str(tmp_path / "cal.npz"),
                              "--verify-inputs", str(tmp_path / "held.npz"),
                              "--min-sqnr", f"{sqnr_held - 1:.1f}", "-o", str(pte))
    assert code == 0, err
    assert "warning" not in err and "BELOW" not in err, err
    assert f"accuracy measured on {tmp_path / 'held.npz'}\n" in err, err


def test_min_sqnr_applies_to_quantize(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(PLAIN)
    code, _, err = _compile(capsys, str(tmp_path / "plain.py"), "--min-sqnr", "30")
    assert code == 2 and "error[E0200]: a minimum SQNR applies to --quantize" in err, err
    with pytest.raises(UsageError, match="not NaN"):
        compile_module(torch.nn.Linear(2, 2), (torch.randn(1, 2),),
                       options=CompileOptions(quantize="int8", min_sqnr_db=math.nan))


# --------------------------------------------------------------------------
# The quantized model, in eager, from the API.
# --------------------------------------------------------------------------


def test_the_quantized_module_is_what_the_program_computes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).eval()
    x = torch.randn(4, 16)
    result = compile_module(model, (x,), options=CompileOptions(quantize="int8"),
                            warn=lambda message: None)
    quantized = result.quantized_modules["forward"]
    assert result.quantization is not None
    step = result.quantization.output_step
    with torch.no_grad():
        eager = quantized(x)
        program = torch.as_tensor(load(result.data).method("forward").run([x])[0])
        float_out = model(x)
    assert (program - eager).abs().max() <= step + 1e-6
    assert (eager - float_out).abs().max() > 0  # it is the quantized model, not the float one


class CachedStep(torch.nn.Module):
    """A decoder in miniature: what a call writes at its positions, later calls read."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 32)
        self.fc = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 16)
        self.register_buffer("cache", torch.zeros(8, 32))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, positions, self.fc(self.embed(tokens)))
        return self.head(self.cache.cumsum(0)[positions])


def test_the_quantized_methods_generate_as_the_program_does() -> None:
    torch.manual_seed(0)
    model = CachedStep().eval()
    prompt, step = (torch.tensor([1, 2, 3]), torch.arange(3)), (torch.tensor([4]),
                                                                  torch.tensor([3]))
    result = compile_module(model, step, methods={"prefill": (model, prompt)},
                            options=CompileOptions(quantize="int8-weight-only"))
    prefill, forward = (result.quantized_modules[name] for name in ("prefill", "forward"))
    program = load(result.data)
    with torch.no_grad():
        # The quantized methods share the cache as the program's methods share state.
        eager = [prefill(*prompt), forward(*step)]
        run = [torch.as_tensor(program.method(name).run(list(args))[0])
               for name, args in (("prefill", prompt), ("forward", step))]
        model.cache.zero_()
        floats = [model(*prompt), model(*step)]
    for got, expected in zip(run, eager):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert not torch.equal(eager[1], floats[1])  # quantized weights, not the float ones
