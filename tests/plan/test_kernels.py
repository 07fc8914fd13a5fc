"""Target kernel lists and the compile-time kernel check."""

from __future__ import annotations

import importlib.resources

import pytest
import torch

from exirc.backend.ops import addmm_relu
from exirc.errors import UnsupportedOperatorError, UsageError
from exirc.plan.kernels import check_kernels, kernel_name, kernels_for_target
from exirc.targets import kernel_list
from tests.oracle import requires_executorch

aten = torch.ops.aten


@pytest.mark.smoke
def test_portable_list_has_real_ops_only() -> None:
    portable = kernels_for_target("portable")
    assert {"aten::add.out", "aten::mm.out", "aten::sym_size.int"} <= portable
    assert "aten::made_up_op.out" not in portable
    assert "aten::add.Tensor" not in portable  # kernels are out-variants


def test_portable_file_is_sorted_one_op_a_line() -> None:
    text = importlib.resources.files("exirc.targets").joinpath("portable_kernels.txt").read_text()
    lines = text.splitlines()
    assert lines == sorted(set(lines)) and all("::" in line for line in lines)


@requires_executorch
def test_portable_list_matches_executorch_runtime() -> None:
    """ExecuTorch's runtime with its quantized kernel library linked (in Python:
    imported) has exactly the portable target's kernels."""
    import executorch.kernels.quantized  # noqa: F401  (registers its kernels)
    from executorch.extension.pybindings import portable_lib

    # Its LLM custom-op library registers llama::* (and preprocess::*) kernels once a
    # test of --target xnnpack-llm has imported it into this process: not portable.
    names = {name for name in portable_lib._get_operator_names()
             if name.split("::")[0] not in ("llama", "preprocess")}
    assert kernel_list("portable") | kernel_list("quantized") == names
    assert kernels_for_target("portable") == kernel_list("portable") | kernel_list("quantized")


@requires_executorch
def test_llama_list_is_in_executorchs_llm_custom_op_library() -> None:
    """The kernels --target xnnpack-llm adds are ExecuTorch's LLM custom ops."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers them)
    from executorch.extension.pybindings import portable_lib

    assert kernel_list("llama") <= set(portable_lib._get_operator_names())
    assert kernels_for_target("xnnpack-llm") == \
        kernels_for_target("xnnpack") | kernel_list("llama")


def test_exirc_target_adds_backend_ops_and_extra() -> None:
    exirc = kernels_for_target("exirc", extra=["exirc::mine.out"])
    assert kernels_for_target("portable") < exirc
    assert {"exirc::addmm_relu.out", "exirc::mine.out"} <= exirc
    with pytest.raises(UsageError, match="unknown target 'gpu'"):
        kernels_for_target("gpu")


def test_kernel_names() -> None:
    assert kernel_name(aten.add.out) == "aten::add.out"
    assert kernel_name(aten.sigmoid.default) == "aten::sigmoid"
    assert kernel_name(addmm_relu) == "exirc::addmm_relu.out"
    assert kernel_name(torch.ops.higher_order.cond) is None


class Unsupported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.cumprod(x, 0)
        b = torch.erfinv(x)
        c = torch.cumprod(x, 0)
        return a + b + c


def test_check_kernels_lists_every_missing_op_at_once() -> None:
    graph_module = torch.export.export(Unsupported(), (torch.rand(3),)).graph_module
    with pytest.raises(UnsupportedOperatorError) as raised:
        check_kernels(graph_module, "portable")
    error = raised.value
    message = str(error)
    assert "target 'portable' cannot run 2 ops" in message
    assert "aten::cumprod (no kernel for aten::cumprod.out)" in message
    assert "aten::erfinv (no kernel for aten::erfinv.out)" in message
    assert "aten::add" not in message
    assert "test_kernels.py:" in message and "b = torch.erfinv(x)" in message
    assert message.count("test_kernels.py:") == 3  # both cumprod calls, the erfinv one
    assert error.exit_code == 4
    # No built-in target has these kernels, so the hint suggests none.
    assert error.hint and "--target" not in error.hint
    check_kernels(graph_module, "portable",
                  extra=["aten::cumprod.out", "aten::erfinv.out"])  # a registered kernel


def test_check_kernels_passes_supported_functional_and_out_variant_ops() -> None:
    graph = torch.fx.Graph()
    x, out = graph.placeholder("x"), graph.placeholder("out")
    y = graph.call_function(aten.relu.default, (x,))
    z = graph.call_function(aten.add.out, (x, y), {"out": out})
    graph.output(z)
    check_kernels(torch.fx.GraphModule(torch.nn.Module(), graph), "portable")


def test_backend_op_needs_the_exirc_target() -> None:
    graph = torch.fx.Graph()
    a, b, c = (graph.placeholder(n) for n in "abc")
    graph.output(graph.call_function(addmm_relu, (a, b, c)))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(UnsupportedOperatorError, match=r"exirc::addmm_relu.out \(no kernel\)") \
            as raised:
        check_kernels(graph_module, "portable")
    assert raised.value.hint and raised.value.hint.startswith("use --target exirc, or ")
    check_kernels(graph_module, "exirc")
