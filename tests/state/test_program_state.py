"""Buffers the model updates are program state: kept from call to call, shared by
methods, starting from their value at compile time (exirc.ir.state).

Every test compares several consecutive calls with eager PyTorch making the
same calls, through exirc's runtime and, where marked, ExecuTorch's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exirc.compiler import CompileOptions, compile_model, compile_module
from exirc.errors import UsageError, VerificationError
from exirc.runtime import load
from tests.oracle import requires_executorch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Counter(torch.nn.Module):
    """A running total that starts from a non-zero value."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.arange(3, dtype=torch.float32) + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return self.total * 2


class SliceWrite(torch.nn.Module):
    """A cache written through a view (slice assignment), read whole."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache[1:3] = self.cache[1:3] + x
        self.steps += 1
        return self.cache.sum(0), self.steps.clone()


class InputWriter(torch.nn.Module):
    """Writes into its input in place, as user code sometimes does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1


class Shared(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.ones(3))


class Accumulate(torch.nn.Module):
    def __init__(self, state: Shared) -> None:
        super().__init__()
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.total.add_(x)
        return self.state.total * 1


class Read(torch.nn.Module):
    """Reads the state another method updates: it must not be folded as a constant."""

    def __init__(self, state: Shared) -> None:
        super().__init__()
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.state.total * x


def _eager_calls(module: torch.nn.Module, inputs: list[tuple[torch.Tensor, ...]]
                 ) -> list[list[torch.Tensor]]:
    saved = {name: b.clone() for name, b in module.named_buffers()}
    with torch.no_grad():
        results = []
        for args in inputs:
            out = module(*[a.clone() for a in args])
            results.append(list(out) if isinstance(out, tuple) else [out])
    for name, buffer in module.named_buffers():
        buffer.copy_(saved[name])
    return results


def _assert_calls(got: list[list[torch.Tensor]], expected: list[list[torch.Tensor]]) -> None:
    assert len(got) == len(expected)
    for call, (outs, wants) in enumerate(zip(got, expected)):
        assert len(outs) == len(wants), f"call {call + 1}: {len(outs)} outputs"
        for out, want in zip(outs, wants):
            torch.testing.assert_close(out, want, msg=lambda m, n=call + 1: f"call {n}: {m}")


@pytest.mark.parametrize("target", ["portable", "exirc"])
@pytest.mark.parametrize("make", [Counter, SliceWrite, InputWriter])
def test_updates_persist_across_calls_like_eager(make: type, target: str) -> None:
    module = make().eval()
    calls = [(torch.randn(3),) for _ in range(4)]
    expected = _eager_calls(module, calls)
    result = compile_module(module, calls[0], options=CompileOptions(target=target))
    program = load(result.data)
    got = [program.run("forward", list(args)) for args in calls]
    _assert_calls(got, expected)
    # Only what the model returns: no buffer as an extra output.
    assert len(result.program.method("forward").outputs) == len(expected[0])
    program.reset_state()
    _assert_calls([program.run("forward", list(args)) for args in calls], expected)


def test_state_is_stored_with_its_initial_value_and_shown_by_inspect(tmp_path: Path) -> None:
    result = compile_module(Counter().eval(), (torch.ones(3),))
    plan = result.program.method("forward")
    assert plan.non_const_buffer_sizes[2] == 16  # 12 bytes, aligned
    assert result.report.state_bytes == 16
    path = tmp_path / "counter.pte"
    result.save(path)
    shown = subprocess.run([sys.executable, "-m", "exirc", "inspect", str(path)],
                           capture_output=True, text=True, check=True, timeout=300).stdout
    assert "state: 1 tensor, 12 B, kept from run to run" in shown
    assert "total: f32[3], 12 B in buffer 2 at 0" in shown
    memory = subprocess.run([sys.executable, "-m", "exirc", "inspect", str(path), "--show",
                             "memory"], capture_output=True, text=True, check=True,
                            timeout=300).stdout
    assert "arena 2: 1 planned tensor (shared by every method, kept from run to run" in memory
    # A fresh load starts from the value at compile time, not zeros.
    assert load(path).run("forward", [torch.zeros(3)])[0].tolist() == [2.0, 4.0, 6.0]


def test_methods_share_state_even_through_different_modules() -> None:
    shared = Shared()
    accumulate, read = Accumulate(shared), Read(shared)
    x = torch.full((3,), 2.0)
    result = compile_module(accumulate, (x,), methods={"read": (read, (x,))})
    program = load(result.data)
    assert program.run("read", [x])[0].tolist() == [2.0, 2.0, 2.0]
    assert program.run("forward", [x])[0].tolist() == [3.0, 3.0, 3.0]
    assert program.run("read", [x])[0].tolist() == [6.0, 6.0, 6.0]  # sees the update
    program.reset_state()
    assert program.run("read", [x])[0].tolist() == [2.0, 2.0, 2.0]


def _drop_write_back_source() -> str:
    return '''
import torch
from exirc.passes.contract import PassResult

def drop_state_updates(program):
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.copy_.default:
            graph.erase_node(node)
    program.graph_module.recompile()
    return PassResult(program, True)
'''


def test_verify_catches_a_lost_update_from_the_second_call(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from tests.plugin_modules import plugin_module

    for name in plugin_module(tmp_path, monkeypatch, _drop_write_back_source(), "lose_state"):
        pipeline = tmp_path / "lossy.yaml"
        pipeline.write_text(
            "target: portable\nstages:\n  edge: [to_edge, views_to_copies, scalars_to_tensors]\n"
            f"  plan: [write_back_state, {name}:drop_state_updates, to_out_variants, "
            "memory_plan]\n")
        with pytest.raises(VerificationError) as raised:
            compile_module(Counter().eval(), (torch.ones(3),),
                           options=CompileOptions(pipeline=pipeline, verify=True))
        message = raised.value.message
        assert "forward case 0 call 2 of 3 differs" in message
        assert "call 1 of 3" not in message  # the first call is right: only state is lost
        assert "state after 1 call differs" in message


def test_a_pipeline_without_write_back_is_refused(tmp_path: Path) -> None:
    pipeline = tmp_path / "no_write_back.yaml"
    pipeline.write_text("target: portable\nstages:\n  edge: [to_edge, views_to_copies, "
                        "scalars_to_tensors]\n  plan: [to_out_variants, memory_plan]\n")
    with pytest.raises(UsageError, match="leaves updates of total as outputs") as raised:
        compile_module(Counter().eval(), (torch.ones(3),),
                       options=CompileOptions(pipeline=pipeline))
    assert "write_back_state" in (raised.value.hint or "")


def test_bundle_replays_consecutive_calls(tmp_path: Path) -> None:
    model = tmp_path / "counter.py"
    model.write_text("import torch\nfrom tests.state.test_program_state import Counter\n"
                     "model = Counter().eval()\nexample_inputs = (torch.ones(3),)\n")
    result = compile_model(str(model), CompileOptions(verify=True, bundle=True))
    assert result.bundled_cases == 3
    assert result.verification is not None and result.verification.ok
    path = tmp_path / "counter.pte"
    result.save(path)
    run = subprocess.run([sys.executable, "-m", "exirc", "run", str(path), "--check"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "forward case 2 (call 3 in a row): pass" in run.stdout


@pytest.fixture(scope="module")
def kv_decoder() -> tuple[object, bytes]:
    """examples/generate.py (its generation loop and model), and the compiled decoder."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import generate
    finally:
        sys.path.remove(str(EXAMPLES))
    result = compile_model(str(EXAMPLES / "kv_decoder.py"), CompileOptions(verify=True))
    return generate, result.data


def _eager_tokens(example: object, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """The example's generation loop on the eager model, its cache restored after."""
    model = example.model
    saved = {n: b.clone() for n, b in model.named_buffers()}

    def step(method: str, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(tokens, positions)

    try:
        return example.generate(step, prompt, new_tokens)
    finally:
        for name, buffer in model.named_buffers():
            buffer.copy_(saved[name])


def _prompt(example: object, seed: int) -> torch.Tensor:
    return torch.randint(0, example.VOCAB, (example.PROMPT,),
                         generator=torch.Generator().manual_seed(seed))


def test_kv_cache_decoder_generates_the_eager_tokens(kv_decoder: tuple[object, bytes]) -> None:
    example, data = kv_decoder
    prompt = _prompt(example, 3)
    program = load(data)
    got = example.generate(lambda m, *inputs: program.run(m, list(inputs))[0], prompt, 20)
    assert got == _eager_tokens(example, prompt, 20)
    assert len(set(got)) > 1  # a constant answer would hide a stale cache


@requires_executorch
def test_executorch_runs_our_stateful_files_like_eager(kv_decoder: tuple[object, bytes]
                                                       ) -> None:
    from executorch.runtime import Runtime

    example, data = kv_decoder
    loaded = Runtime.get().load_program(data)
    methods = {name: loaded.load_method(name) for name in ("prefill", "forward")}
    prompt = _prompt(example, 4)
    got = example.generate(lambda m, *inputs: methods[m].execute(inputs)[0], prompt, 12)
    assert got == _eager_tokens(example, prompt, 12)

    counter = Counter().eval()
    calls = [(torch.randn(3),) for _ in range(3)]
    want = _eager_calls(counter, calls)
    program = Runtime.get().load_program(compile_module(counter, calls[0]).data)
    forward = program.load_method("forward")
    _assert_calls([list(forward.execute(args)) for args in calls], want)
