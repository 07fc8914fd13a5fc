"""The seam between the interpreter and the engines: one policy, one choice per
method and delegate, said in words; `--verify` blames an engine that is wrong,
not a pass; `--dump-engine` shows what the engines built.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UsageError, VerificationError
from exirc.runtime import load
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.runtime.engines import seam
from exirc.runtime.engines.policy import ENGINE_VARIABLE, EnginePolicy
from tests.runtime.delegates.xnnpack.zoo import ZOO


class Perturbing:
    """A test-only engine that runs XNNPACK delegates on the reference executor and
    then adds 0.01 to their first output: wrong, as an engine bug would be."""

    name = "perturbing"
    runs_delegates = True

    def missing(self) -> str:
        return ""

    def prepare_delegate(self, backend_id: str, handle: Any, policy: EnginePolicy) -> Any:
        return _Perturbed(handle) if isinstance(handle, CompiledGraph) else None

    def prepare_method(self, view: seam.MethodView, policy: EnginePolicy) -> seam.Refusal:
        return seam.Refusal(self.name, "it runs delegates only")


class _Perturbed:
    def __init__(self, graph: CompiledGraph) -> None:
        self.graph = graph

    def execute(self, args: list[Any]) -> None:
        execute(self.graph, args)
        args[self.graph.outputs[0].arg].add_(0.01)


@pytest.fixture()
def perturbing() -> Iterator[str]:
    seam.register_engine(Perturbing())
    yield "perturbing"
    seam.unregister_engine("perturbing")


@functools.cache
def mlp_program() -> bytes:
    model = ZOO["mlp"]
    return compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack")).data


def test_verify_blames_a_wrong_engine_not_a_pass(perturbing: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    model = ZOO["mlp"]
    monkeypatch.setenv(ENGINE_VARIABLE, perturbing)
    with pytest.raises(VerificationError) as raised:
        compile_module(model.module(), model.inputs(),
                       options=CompileOptions(target="xnnpack", verify=True))
    message, hint = raised.value.message, raised.value.hint or ""
    assert "differs between the reference interpreter and the perturbing engine" in message
    assert "the program itself matches eager PyTorch on the reference" in message
    assert "output_0: max abs error 0.01" in message
    assert "pass" not in message  # nothing is blamed on the compiler
    assert "--engine reference" in hint
    monkeypatch.setenv(ENGINE_VARIABLE, "reference")
    result = compile_module(model.module(), model.inputs(),
                            options=CompileOptions(target="xnnpack", verify=True))
    assert result.verification is not None and result.verification.ok


def test_the_engine_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINE_VARIABLE, "reference")
    assert EnginePolicy.resolve().requested == "reference"
    assert EnginePolicy.resolve("auto").requested == "auto"
    monkeypatch.delenv(ENGINE_VARIABLE)
    assert EnginePolicy.resolve() == EnginePolicy("auto", "the default")
    with pytest.raises(UsageError, match="asks for engine 'tensorrt', which exirc does not "
                                         "have"):
        load(mlp_program(), engine="tensorrt")


def test_each_method_and_delegate_says_which_engine_runs_it() -> None:
    pytest.importorskip("onnxruntime")
    reference = load(mlp_program(), engine="reference").method("forward")
    assert (reference.engine, reference.delegate_engines) == ("reference", ["reference"])
    assert reference.execution == "instruction by instruction (engine='reference')"
    onnxruntime = load(mlp_program(), engine="onnxruntime").method("forward")
    assert (onnxruntime.engine, onnxruntime.delegate_engines) == ("onnxruntime",
                                                                  ["onnxruntime"])


def test_dump_engine_writes_the_models_and_the_rules(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    path = tmp_path / "mlp.pte"
    path.write_bytes(mlp_program())
    dump = tmp_path / "engines"
    done = subprocess.run([sys.executable, "-m", "exirc", "run", str(path), "--random",
                           "--engine", "onnxruntime", "--dump-engine", str(dump)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dump.iterdir()) == [
        "engines.txt", "forward.delegate0.onnxruntime.onnx",
        "forward.delegate0.onnxruntime.rules.txt", "forward.onnxruntime.onnx",
        "forward.onnxruntime.rules.txt"]
    summary = (dump / "engines.txt").read_text().splitlines()
    assert summary == ["method forward: one onnxruntime session (the method's chain, fused "
                       "at load)", "  delegate 0: onnxruntime"]
    model = onnx.load(str(dump / "forward.onnxruntime.onnx"))
    assert {"Gemm", "MatMul"} & {node.op_type for node in model.graph.node}
    rules = (dump / "forward.delegate0.onnxruntime.rules.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in rules] == [
        "tanh_gelu", "hard_sigmoid", "lstm", "gru", "reshapes", "recurrent_input"]


def test_run_says_the_engine_in_json(tmp_path: Path) -> None:
    import json

    path = tmp_path / "mlp.pte"
    path.write_bytes(mlp_program())
    done = subprocess.run([sys.executable, "-m", "exirc", "run", str(path), "--random",
                           "--engine", "reference", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["engine"] == "reference" and body["delegate_engines"] == ["reference"]
    assert body["execution"] == "instruction by instruction (engine='reference')"
