"""The compiler never writes a file its own loader would refuse (issue 32).

Before `exirc compile` hands out a program it loads the bytes on the reference
interpreter with every check `exirc run` makes (but this machine's memory):
a program that writes into a constant, the silent miscompile a non-persistent
KV cache once caused, fails the compile and leaves no file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_conventions import run
from tests.compile.test_cli_compile import MLP, write
from tests.plugin_modules import plugin_module

# A plan-stage pass (where write_back_state's copies are) that makes the program
# write into one of its weights.
WRITES_A_CONSTANT = '''
import torch
from exirc.passes.contract import PassResult

def write_into_a_weight(program):
    graph = program.graph_module.graph
    weight = next(n for n in graph.nodes if n.op == "placeholder")
    output = graph.output_node()
    with graph.inserting_before(output):
        doubled = graph.call_function(torch.ops.aten.mul.Tensor, (weight, weight))
        written = graph.call_function(torch.ops.aten.copy_.default, (weight, doubled))
    doubled.meta["val"] = written.meta["val"] = weight.meta["val"]
    program.graph_module.recompile()
    return PassResult(program, True)
'''


def test_a_program_the_loader_refuses_is_never_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", MLP)
    for name in plugin_module(tmp_path, monkeypatch, WRITES_A_CONSTANT, "writes_constant"):
        (tmp_path / "lossy.yaml").write_text(
            "target: portable\nstages:\n  edge: [to_edge, views_to_copies, "
            "scalars_to_tensors]\n"
            f"  plan: [write_back_state, {name}:write_into_a_weight, to_out_variants, "
            "memory_plan]\n")
        code, out, err = run(capsys, "compile", "model.py", "--pipeline", "lossy.yaml",
                             "-o", "model.pte")
        assert code == 1, err
        assert "error[E0100]: the compiled program fails exirc's own load checks, so no " \
               "file was written" in err
        assert "writes into value" in err and "a constant tensor" in err
        assert "a pass of a custom pipeline" in err
        assert "Traceback" not in err
        assert not (tmp_path / "model.pte").exists()
        assert list(tmp_path.glob("*.pte*")) == []  # no partial file either
        # The default pipeline's program loads, and is written.
        code, _, err = run(capsys, "compile", "model.py", "-o", "model.pte")
        assert code == 0, err
        assert (tmp_path / "model.pte").stat().st_size > 0


def _lossy_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline whose plugin pass makes the program write into a weight."""
    (name,) = plugin_module(tmp_path, monkeypatch, WRITES_A_CONSTANT, "writes_constant")
    pipeline = tmp_path / "lossy.yaml"
    pipeline.write_text(
        "target: portable\nstages:\n  edge: [to_edge, views_to_copies, scalars_to_tensors]\n"
        f"  plan: [write_back_state, {name}:write_into_a_weight, to_out_variants, "
        "memory_plan]\n")
    return pipeline


# What the user sees for a program exirc made and its own loader refuses: a bug
# of exirc or of the custom pipeline, never FormatError's "re-create it with
# `exirc compile`" (the command that just made it).
REFUSED = ("error[E0100]: the compiled program fails exirc's own load checks, so no file "
           "was written: error[E0300]: ")
HINT = ("  hint: this is a bug in exirc or in a pass of a custom pipeline (--pipeline): report "
        "it with the command you ran and --debug output")


def test_under_verify_a_refused_program_is_a_bug_not_a_file_to_re_create(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", MLP)
    pipeline = _lossy_pipeline(tmp_path, monkeypatch)
    code, _, err = run(capsys, "compile", "model.py", "--pipeline", str(pipeline), "--verify",
                       "-o", "model.pte")
    assert code == 1, err
    lines = err.splitlines()
    assert lines[0].startswith(REFUSED) and "writes into value" in lines[0]
    assert lines[1] == HINT
    assert "re-create" not in err
    assert not (tmp_path / "model.pte").exists()


def test_verify_running_a_program_its_loader_refuses_says_so_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Without the load check, --verify's own load of the program is the one to
    # refuse it: the same bug, the same words.
    import exirc.compiler

    monkeypatch.setattr(exirc.compiler, "check_loadable",
                        lambda data, kernels, external=None: None)
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", MLP)
    pipeline = _lossy_pipeline(tmp_path, monkeypatch)
    code, _, err = run(capsys, "compile", "model.py", "--pipeline", str(pipeline), "--verify",
                       "-o", "model.pte")
    assert code == 1, err
    lines = err.splitlines()
    assert lines[0].startswith(REFUSED) and "writes into value" in lines[0]
    assert lines[1] == HINT
    assert "re-create" not in err
    assert not (tmp_path / "model.pte").exists()
