"""`exirc compile --bundle` and `exirc run --check`: test cases inside the program.

The cases live in a named-data segment that ExecuTorch's runtime ignores, so
the file still runs there; `run --check` re-runs them; a file whose expected
outputs no longer match fails with exit code 5, naming the case and output;
a damaged segment is a FormatError.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy
import pytest
import torch

from exirc.cli.app import main
from exirc.diagnostics.bundle import from_torch, make_bundle, to_torch
from exirc.errors import FormatError
from exirc.runtime import load
from exirc.serialize import deserialize
from exirc.serialize.bundled_cases import (
    NAMED_DATA_KEY,
    Bundle,
    BundledTensor,
    decode,
    encode,
    read_bundle,
    write_bundle,
)
from exirc.serialize.writer import serialize
from tests.cli.test_conventions import run
from tests.compile.test_cli_compile import write
from tests.diagnostics.test_verify import NET
from tests.oracle import requires_executorch, run_with_executorch
from tests.passes.test_pipeline import PLUGIN, portable_with
from tests.plugin_modules import plugin_module

RAMP = torch.linspace(-2, 2, 16).reshape(2, 8)


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NET compiled with --verify --bundle on two .npz files: two cases."""
    directory = tmp_path_factory.mktemp("bundled")
    write(directory, "model.py", NET)
    numpy.savez(directory / "ones.npz", input_0=numpy.ones((2, 8), numpy.float32))
    numpy.savez(directory / "ramp.npz", input_0=RAMP.numpy())
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        code = main(["compile", "model.py", "--verify", "--bundle", "--verify-inputs",
                     "ones.npz", "--verify-inputs", "ramp.npz", "-q", "-o", "model.pte"])
    assert code == 0
    return directory / "model.pte"


@pytest.fixture()
def copy(bundled: Path, tmp_path: Path) -> Path:
    """A copy of the bundled program that a test may change."""
    path = tmp_path / "model.pte"
    path.write_bytes(bundled.read_bytes())
    return path


# --------------------------------------------------------------------------
# Round trip.
# --------------------------------------------------------------------------


def test_run_check_passes_on_a_bundled_program(capsys: pytest.CaptureFixture[str],
                                               bundled: Path) -> None:
    code, out, err = run(capsys, "run", str(bundled), "--check")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("forward case 0: pass (1 output, max abs error ")
    assert lines[1].startswith("forward case 1: pass (1 output, max abs error ")
    assert lines[2] == "2 bundled test cases passed (rtol 0.0001, atol 1e-05)"


def test_the_bundle_holds_the_inputs_and_eager_outputs(bundled: Path) -> None:
    bundle = read_bundle(deserialize(bundled.read_bytes()))
    assert bundle is not None and (bundle.rtol, bundle.atol) == (1e-4, 1e-5)
    first, second = bundle.cases
    assert first.method == second.method == "forward"
    (x,) = second.inputs
    assert isinstance(x, BundledTensor) and x.describe() == "float32[2, 8]"
    assert torch.equal(to_torch(x), RAMP)
    (expected,) = second.outputs
    assert isinstance(expected, BundledTensor) and expected.shape == (2, 4)


def test_inspect_shows_the_bundled_cases(capsys: pytest.CaptureFixture[str],
                                         bundled: Path) -> None:
    code, out, _ = run(capsys, "inspect", str(bundled))
    assert code == 0
    assert "bundled test cases: forward 2 (run them with `exirc run --check`)" in out
    assert "(named_data)" in out
    code, out, _ = run(capsys, "inspect", str(bundled), "--json")
    assert code == 0 and json.loads(out)["bundled_cases"] == {"forward": 2}


def test_a_program_without_cases_shows_none_and_check_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    write(tmp_path, "model.py", NET)
    pte = tmp_path / "plain.pte"
    assert main(["compile", str(tmp_path / "model.py"), "-q", "-o", str(pte)]) == 0
    code, out, _ = run(capsys, "inspect", str(pte), "--json")
    assert json.loads(out)["bundled_cases"] == {}

    code, out, err = run(capsys, "run", str(pte), "--check")

    assert (code, out) == (2, "")
    assert err.splitlines()[:2] == [
        "error[E0200]: the program has no bundled test cases",
        "  hint: compile it with `exirc compile MODEL --bundle` to store its inputs and "
        "expected outputs in the file"]


@requires_executorch
def test_executorch_runs_a_bundled_program(bundled: Path) -> None:
    data = bundled.read_bytes()
    x = torch.randn(2, 8)
    (theirs,) = run_with_executorch(data, [x])
    (ours,) = load(data).run("forward", [x])
    torch.testing.assert_close(theirs, ours)


# --------------------------------------------------------------------------
# Failing cases.
# --------------------------------------------------------------------------


def test_run_check_fails_when_the_expected_outputs_differ(
        capsys: pytest.CaptureFixture[str], copy: Path) -> None:
    program = deserialize(copy.read_bytes())
    bundle = read_bundle(program)
    assert bundle is not None
    first, second = bundle.cases
    (expected,) = second.outputs
    wrong = to_torch(expected)
    wrong[1, 2] += 0.5
    write_bundle(program, replace(bundle, cases=(first, replace(second,
                                                                outputs=(from_torch(wrong),)))))
    copy.write_bytes(serialize(program))

    code, out, err = run(capsys, "run", str(copy), "--check")

    assert code == 5
    lines = out.splitlines()
    assert lines[0].startswith("forward case 0: pass")
    assert lines[1].startswith("forward case 1: FAIL: output_0: max abs error 0.5 (rel ")
    assert lines[1].endswith("at [1, 2]: got "
                             f"{to_torch(expected)[1, 2].item():.6g}, expected "
                             f"{wrong[1, 2].item():.6g}; 1 of 8 elements differ")
    assert err.startswith("error[E0500]: 1 of 2 bundled test cases failed (rtol 0.0001, atol "
                          "1e-05); first: forward case 1: output_0: max abs error 0.5")
    assert "  hint: the program no longer computes what the model did" in err


def test_looser_stored_tolerances_are_used(capsys: pytest.CaptureFixture[str],
                                           copy: Path) -> None:
    program = deserialize(copy.read_bytes())
    bundle = read_bundle(program)
    assert bundle is not None
    case = bundle.cases[0]
    (expected,) = case.outputs
    nudged = to_torch(expected) + 1e-3
    write_bundle(program, Bundle((replace(case, outputs=(from_torch(nudged),)),), 0.0, 1e-2))
    copy.write_bytes(serialize(program))

    code, out, _ = run(capsys, "run", str(copy), "--check")

    assert code == 0, out
    assert out.splitlines()[-1] == "1 bundled test case passed (rtol 0, atol 0.01)"


@pytest.fixture()
def swap_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from plugin_module(tmp_path, monkeypatch, PLUGIN, "exirc_bundle_plugin")


def test_bundling_without_verify_stores_eager_outputs_that_check_then_catches(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        swap_plugin: str) -> None:
    # A semantics-changing pass without --verify: the file is written, but the
    # cases hold eager PyTorch's outputs, so `run --check` finds the difference.
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", NET)
    write(tmp_path, "swap.yaml", portable_with([f"{swap_plugin}:SwapRelu"]))
    assert main(["compile", "model.py", "--pipeline", "swap.yaml", "--bundle", "-q",
                 "-o", "model.pte"]) == 0

    code, out, err = run(capsys, "run", "model.pte", "--check")

    assert code == 5
    assert out.startswith("forward case 0: FAIL: output_0: max abs error ")
    assert err.startswith("error[E0500]: 1 of 1 bundled test case failed")


# --------------------------------------------------------------------------
# The format: round trips, and damaged segments.
# --------------------------------------------------------------------------


def test_every_value_kind_round_trips() -> None:
    values = [torch.randn(2, 3), torch.tensor(True), torch.zeros(0, 4), torch.arange(5),
              torch.randn(3).to(torch.bfloat16), torch.randn(2, dtype=torch.complex64),
              3, 2.5, float("nan"), False]
    bundle = make_bundle([("forward", values, [None, values[0]], 0)], 1e-3, 0.0)

    again = decode(encode(bundle))

    assert (again.rtol, again.atol) == (1e-3, 0.0)
    (case,) = again.cases
    for original, stored in zip(values, case.inputs):
        value = to_torch(stored)
        if isinstance(original, torch.Tensor):
            assert value.dtype == original.dtype and value.shape == original.shape
            assert torch.equal(value, original)
        elif isinstance(original, float) and original != original:
            assert value != value  # nan
        else:
            assert value == original and type(value) is type(original)
    assert case.outputs[0] is None and torch.equal(to_torch(case.outputs[1]), values[0])


def _segment(header: object, data: bytes = b"", magic: bytes = b"EXIRCBIO",
             version: int = 1) -> bytes:
    text = json.dumps(header).encode()
    prefix = struct.pack("<8sII", magic, version, len(text)) + text
    return prefix + bytes(-len(prefix) % 16) + data


def _case(value: object) -> dict[str, object]:
    return {"rtol": 1e-4, "atol": 1e-5, "cases": [
        {"method": "forward", "inputs": [value], "outputs": []}]}


TENSOR = {"dtype": "float32", "shape": [2], "offset": 0}
WHERE = f"named_data[{NAMED_DATA_KEY!r}]"


@pytest.mark.parametrize("data, field, message", [
    (b"EXIRC", "", "5 bytes, too short for the 16-byte prefix"),
    (_segment({}, magic=b"NOTABUND"), ".magic", "b'NOTABUND', expected b'EXIRCBIO'"),
    (_segment({}, version=9), ".version", "format version 9; this exirc reads 1"),
    (struct.pack("<8sII", b"EXIRCBIO", 1, 1000) + b"{}", ".header",
     "header of 1000 bytes does not fit (segment of 18 bytes, at most 4194304)"),
    (struct.pack("<8sII", b"EXIRCBIO", 1, 3) + b"{x}", ".header", "not JSON: "),
    (_segment([]), ".header", "not a JSON object"),
    (_segment({"rtol": -1, "atol": 0, "cases": []}), ".rtol", "-1 is not a tolerance"),
    (_segment({"rtol": 0, "atol": 0, "cases": {}}), ".cases", "a list of at most 4096 cases"),
    (_segment(_case(TENSOR), bytes(4)), ".cases[0].inputs[0]",
     "float32[2] needs bytes 0..8, but the data has 4"),
    (_segment(_case({**TENSOR, "dtype": "object"}), bytes(8)), ".cases[0].inputs[0].dtype",
     "'object' is not a dtype"),
    (_segment(_case({**TENSOR, "shape": [-2]}), bytes(8)), ".cases[0].inputs[0].shape",
     "[-2] is not a shape"),
    (_segment(_case({**TENSOR, "shape": [1 << 62, 1 << 62]}), bytes(8)),
     ".cases[0].inputs[0]", "float32[4611686018427387904, 4611686018427387904] needs bytes"),
    (_segment(_case({**TENSOR, "dtype": "bool"}), b"\x01\x07"), ".cases[0].inputs[0]",
     "a bool tensor holds bytes other than 0 and 1"),
    (_segment(_case(None)), ".cases[0].inputs[0]", "not a value"),
    (_segment(_case({"float": "eval('1')"})), ".cases[0].inputs[0]",
     "'float': \"eval('1')\" is not a value"),
])
def test_a_damaged_segment_is_a_format_error(data: bytes, field: str, message: str) -> None:
    with pytest.raises(FormatError) as raised:
        decode(data)
    assert raised.value.field == f"{WHERE}{field}"
    assert message in raised.value.message


def test_damaged_cases_fail_run_check_and_inspect_with_exit_3(
        capsys: pytest.CaptureFixture[str], copy: Path) -> None:
    program = deserialize(copy.read_bytes())
    (named,) = [n for n in program.named_data if n.key == NAMED_DATA_KEY]
    program.segments[named.segment_index] = replace(program.segments[named.segment_index],
                                                    data=_segment(_case(TENSOR)))
    copy.write_bytes(serialize(program))

    for command in (["run", str(copy), "--check"], ["inspect", str(copy)]):
        code, out, err = run(capsys, *command)
        assert (code, out) == (3, "")
        assert err.startswith(f"error[E0300]: {WHERE}.cases[0].inputs[0]: float32[2] needs "
                              "bytes 0..8, but the data has 0\n")
    # The program itself is fine: it still runs, and ExecuTorch never reads the segment.
    code, _, err = run(capsys, "run", str(copy), "--random")
    assert code == 0, err


def test_check_refuses_inputs_and_the_like(capsys: pytest.CaptureFixture[str],
                                           bundled: Path) -> None:
    code, _, err = run(capsys, "run", str(bundled), "--check", "--random", "--repeat", "3")
    assert code == 2
    assert err.startswith("error[E0200]: --check runs the bundled inputs; it does not take "
                          "--random, --repeat\n")
