"""Quantization: what `--quantize` saves and costs, beside ExecuTorch's own flow.

For each model of `tests/quantize/models.py` (MLP, CNN, MobileNet-style,
ViT, BERT, GPT-2, tiny configs) and mode (int8 on portable and xnnpack;
int4-weight-only on both for BERT and GPT-2), calibrated on the same three
cases everywhere:

- sizes: the float file and the quantized one for the same target, and the
  weight bytes ratio (`QuantizationReport.weight_ratio`);
- accuracy against the float model: SQNR (the worst output's, dB) and the
  largest absolute error, as the compile reports them;
- latency, measured interleaved in one process (round after round, each file
  in turn, so drift hits all alike) with torch and ExecuTorch's thread pool
  on the same number of threads: exirc's runtime on our file, ExecuTorch's
  runtime on our file, and ExecuTorch's runtime on ExecuTorch's own quantized
  file for the same target (XNNPACKQuantizer, per-channel symmetric,
  through torchao's pt2e; `to_edge` for portable rows, XnnpackPartitioner for
  xnnpack rows). `ours_vs_theirs` is ExecuTorch's runtime on our file over
  ExecuTorch's runtime on theirs (below 1: ours is faster).

ExecuTorch's quantizer fails on some models (GPT-2, static or dynamic: it
quantizes an integer add of the position arithmetic, so the position
embedding gets float indices); then the dynamic scheme is tried, and
`theirs_scheme` says which one ran (`failed`: neither). Weight-only rows have
no ExecuTorch counterpart in XNNPACKQuantizer.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402
import torch  # noqa: E402

from bench.common import Row, bench_threads  # noqa: E402

MODELS = ["mlp", "cnn", "mobilenet", "vit", "bert", "gpt2"]
TARGETS = ["portable", "xnnpack"]
WEIGHT_ONLY_MODELS = {"bert", "gpt2"}
CALIBRATION_CASES = 3
ROUNDS = 15


def run(report: Callable[[Row], None] | None = None) -> list[Row]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        models = [m for m in MODELS if m not in ("vit", "bert", "gpt2")]
    else:
        models = MODELS
    rows: list[Row] = []
    with bench_threads() as threads, _executorch_threads(threads), \
            tempfile.TemporaryDirectory() as scratch:
        for name in models:
            for row in _model_rows(name, Path(scratch)):
                row["threads"] = threads
                if report is not None:
                    report(row)
                rows.append(row)
    for target in TARGETS:
        ratios = [r["ours_vs_theirs"] for r in rows
                  if r["target"] == target and r.get("ours_vs_theirs")]
        if ratios:
            summary: Row = {"bench": "quantization.geomean", "model": "geomean", "mode": "int8",
                            "target": target,
                            "ours_vs_theirs": statistics.geometric_mean(ratios)}
            rows.append(summary)
            if report is not None:
                report(summary)
    return rows


@contextlib.contextmanager
def _executorch_threads(threads: int) -> Iterator[None]:
    """ExecuTorch's thread pool (XNNPACK's) on as many threads as torch's."""
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError:
        yield
        return
    before = portable_lib._threadpool_get_thread_count()
    portable_lib._unsafe_reset_threadpool(threads)
    try:
        yield
    finally:
        portable_lib._unsafe_reset_threadpool(before)


def _have_executorch() -> bool:
    try:
        import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed kernels)
    except ImportError:
        return False
    return True


def _executorch_method(data: bytes) -> tuple[Any, Any]:
    """(program, its forward method) on ExecuTorch's runtime; keep the program."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(data)
    return program, program.load_method("forward")


def _interleaved_ms(calls: list[Callable[[], Any] | None]) -> list[float | None]:
    """Median milliseconds of each call, timed round after round in turn."""
    live = [c for c in calls if c is not None]
    for _ in range(3):
        for warm in live:
            warm()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(ROUNDS):
        for i, call in enumerate(calls):
            if call is None:
                continue
            start = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 if t else None for t in times]


def _sqnr(outputs: list[list[torch.Tensor]], expected: list[list[torch.Tensor]]
          ) -> tuple[float, float]:
    """The worst output's SQNR (dB) over all cases, and the largest abs error."""
    signal: dict[int, float] = {}
    noise: dict[int, float] = {}
    largest = 0.0
    for got, wanted in zip(outputs, expected):
        for i, (a, b) in enumerate(zip(got, wanted)):
            error = a.to(torch.float64) - b.to(torch.float64)
            signal[i] = signal.get(i, 0.0) + float(b.to(torch.float64).square().sum())
            noise[i] = noise.get(i, 0.0) + float(error.square().sum())
            largest = max(largest, float(error.abs().max()))
    worst = min((math.inf if noise[i] == 0 else 10 * math.log10(signal[i] / noise[i]))
                for i in signal)
    return worst, largest


def _executorch_file(module: torch.nn.Module, cases: list[tuple[Any, ...]],
                     target: str) -> tuple[bytes, str] | None:
    """ExecuTorch's own quantized file: XNNPACKQuantizer (static per-channel, else
    dynamic) through torchao's pt2e, lowered for `target`; None if neither works."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    for scheme, dynamic in (("static", False), ("dynamic", True)):
        try:
            captured = torch.export.export(module, cases[0]).module()
            quantizer = XNNPACKQuantizer().set_global(
                get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic))
            prepared = prepare_pt2e(captured, quantizer)
            with torch.no_grad():
                for case in cases:
                    prepared(*case)
            exported = torch.export.export(convert_pt2e(prepared), cases[0])
            if target == "portable":
                edge = to_edge(exported)
            else:
                edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
            return bytes(edge.to_executorch().buffer), scheme
        except Exception:  # noqa: BLE001  (ExecuTorch's flow failing is a result here)
            continue
    return None


def _model_rows(name: str, scratch: Path) -> list[Row]:
    from exirc.compiler import CompileOptions, compile_module
    from exirc.runtime import load
    from tests.quantize.models import ZOO

    model = ZOO[name]
    module, inputs = model.module(), model.inputs()
    cases = [model.inputs(seed) for seed in range(CALIBRATION_CASES)]
    files = []
    for seed, case in enumerate(cases):
        path = scratch / f"{name}_{seed}.npz"
        numpy.savez(path, **{f"input_{i}": t.numpy() for i, t in enumerate(case)})
        files.append(path)
    with torch.no_grad():
        float_outputs = [[o.clone() for o in _tensors(module(*case))] for case in cases]
    have_executorch = _have_executorch()
    args = list(inputs)
    modes = ["int8"] + (["int4-weight-only"] if name in WEIGHT_ONLY_MODELS else [])
    rows = []
    for target in TARGETS:
        float_file = compile_module(module, inputs, options=CompileOptions(target=target))
        theirs = _executorch_file(module, cases, target) if have_executorch else None
        theirs_method: Any = None
        theirs_sqnr = None
        keep: list[Any] = []  # ExecuTorch programs outlive their methods
        if theirs is not None:
            program, theirs_method = _executorch_method(theirs[0])
            keep.append(program)
            outputs = [[o.clone() for o in theirs_method.execute(list(c))] for c in cases]
            theirs_sqnr = _sqnr(outputs, float_outputs)[0]
        for mode in modes:
            options = CompileOptions(target=target, quantize=mode,
                                     calibration_inputs=tuple(files))
            ours = compile_module(module, inputs, options=options)
            report = ours.quantization
            assert report is not None
            exirc_method = load(ours.data).method("forward")
            calls: list[Callable[[], Any] | None] = [lambda m=exirc_method: m.run(args)]
            if have_executorch:
                program, ours_et = _executorch_method(ours.data)
                keep.append(program)
                calls.append(lambda m=ours_et: m.execute(args))
            else:
                calls.append(None)
            calls.append((lambda m=theirs_method: m.execute(args))
                         if theirs_method is not None and mode == "int8" else None)
            exirc_ms, et_ours_ms, et_theirs_ms = _interleaved_ms(calls)
            with_theirs = theirs is not None and mode == "int8"
            rows.append({
                "bench": "quantization", "model": name, "mode": mode, "target": target,
                "float_kb": float_file.report.file_bytes / 1024,
                "quant_kb": ours.report.file_bytes / 1024,
                "file_ratio": ours.report.file_bytes / float_file.report.file_bytes,
                "weight_ratio": report.weight_ratio,
                "sqnr_db": min(a.sqnr_db for a in report.accuracy),
                "max_abs_err": max(a.max_abs_error for a in report.accuracy),
                "exirc_ms": exirc_ms, "et_ours_ms": et_ours_ms, "et_theirs_ms": et_theirs_ms,
                "ours_vs_theirs": et_ours_ms / et_theirs_ms
                if et_ours_ms is not None and et_theirs_ms else None,
                "theirs_scheme": (theirs[1] if theirs else "failed")
                if have_executorch and mode == "int8" else None,
                "theirs_kb": len(theirs[0]) / 1024 if with_theirs and theirs else None,
                "theirs_sqnr_db": theirs_sqnr if with_theirs else None,
            })
        del keep
    return rows


def _tensors(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


if __name__ == "__main__":
    from bench.run import format_table

    print(format_table(run()))
