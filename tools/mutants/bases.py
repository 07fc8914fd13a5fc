"""The base programs mutants are made from: real models, compiled for real.

A base is named `<model>.<flavour>`: the model (`models.MODELS`) and how it
became a program, by exirc (`portable`, `exirc`, `xnnpack`, `int8-xnnpack`,
`int8-portable`: `exirc.compiler` for that target, quantized or not;
`bundled`: portable with its test cases stored in it, for `exirc run
--check`) or by ExecuTorch (`et`: `to_edge(...).to_executorch()`,
`et-xnnpack`: lowered with its XnnpackPartitioner). `<name>.example` is
`exirc compile examples/<name>.py` (the KV-cache decoder's two methods share
program state). ExecuTorch is the test oracle only: its bases are skipped
when it is not installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from tools.mutants.models import MODELS

EXIRC_FLAVOURS = {"portable": ("portable", None), "exirc": ("exirc", None),
                  "xnnpack": ("xnnpack", None), "int8-xnnpack": ("xnnpack", "int8"),
                  "int8-portable": ("portable", "int8")}
EXECUTORCH_FLAVOURS = ("et", "et-xnnpack")

# The bases of the suite in `make test`: every model once, the targets and
# ExecuTorch's files on the cheaper ones. Building them takes ~20 s (ExecuTorch's
# XNNPACK lowering, 10 s more, is left to the campaign: exirc's xnnpack
# payloads have the same layout, constants in named data included).
TEST_BASES = [
    *(f"{model}.portable" for model in MODELS),
    "mlp.exirc", "conv.exirc", "attention.xnnpack", "lstm.xnnpack", "conv.xnnpack",
    "dynamic_batch.xnnpack", "mlp.int8-xnnpack", "mlp.bundled", "refine_loop.example",
    "mlp.et", "cond.et", "dynamic_batch.et",
]

# Everything that builds: the longer campaign's bases.
_ET_MODELS = ["mlp", "conv", "attention", "lstm", "dynamic_batch", "cond", "map", "embedding",
              "gather_topk_pad", "state"]
_ET_XNNPACK_MODELS = ["mlp", "conv", "attention", "lstm", "dynamic_batch", "embedding"]
ALL_BASES = [
    *(f"{model}.{flavour}" for flavour in ("portable", "exirc", "xnnpack") for model in MODELS),
    "mlp.int8-xnnpack", "conv.int8-xnnpack", "attention.int8-xnnpack", "mlp.int8-portable",
    "conv.int8-portable", "mlp.bundled", "cond.bundled", "refine_loop.example",
    "kv_decoder.example",
    *(f"{model}.et" for model in _ET_MODELS),
    *(f"{model}.et-xnnpack" for model in _ET_XNNPACK_MODELS),
]


_ROOT = Path(__file__).resolve().parents[2]


def have_executorch() -> bool:
    return importlib.util.find_spec("executorch") is not None


def available(names: Sequence[str]) -> list[str]:
    """`names` without ExecuTorch's bases when ExecuTorch is not installed."""
    et = have_executorch()
    return [name for name in names if et or name.split(".")[1] not in EXECUTORCH_FLAVOURS]


def build_bases(names: Sequence[str]) -> dict[str, bytes]:
    """The `.pte` bytes of each named base, built in this process."""
    with _quiet():
        return {name: build_base(name) for name in names}


def cached_bases(names: Sequence[str], folder: Path) -> dict[str, bytes]:
    """`build_bases`, kept in `folder` under a key of everything that makes
    them (exirc's source, the models, torch's and ExecuTorch's versions), so
    a base is rebuilt exactly when what would build it changed.

    ExecuTorch's bases are built meanwhile in a second process: importing
    ExecuTorch costs seconds, and this process need not hold it."""
    where = folder / source_key()
    found = {name: (where / f"{name}.pte").read_bytes() for name in names
             if (where / f"{name}.pte").is_file()}
    missing = [name for name in names if name not in found]
    if missing:
        for stale in folder.glob("*"):  # bases of sources that are gone
            if stale.is_dir() and stale != where:
                shutil.rmtree(stale, ignore_errors=True)
        where.mkdir(parents=True, exist_ok=True)
        theirs = [name for name in missing if name.split(".")[1] in EXECUTORCH_FLAVOURS]
        with tempfile.TemporaryFile() as errors:
            helper = subprocess.Popen([sys.executable, "-m", "tools.mutants.bases", str(where),
                                       *theirs], stdout=subprocess.DEVNULL, stderr=errors,
                                      cwd=_ROOT) if theirs else None
            for name, data in build_bases([n for n in missing if n not in theirs]).items():
                (where / f"{name}.pte").write_bytes(data)
            if helper is not None and helper.wait() != 0:
                errors.seek(0)
                raise RuntimeError(f"building {', '.join(theirs)} failed:\n"
                                   + errors.read().decode(errors="replace")[-3000:])
        found.update({name: (where / f"{name}.pte").read_bytes() for name in missing})
    return {name: found[name] for name in names}


def source_key() -> str:
    """A digest of the compiler's sources and versions: equal keys, equal bases."""
    root = _ROOT
    digest = hashlib.sha256()
    files = sorted(p for p in (root / "exirc").rglob("*") if p.suffix in (".py", ".yaml", ".txt"))
    files += [root / "tools" / "mutants" / "models.py", Path(__file__).resolve()]
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    for package in ("torch", "torchao", "executorch"):
        try:
            digest.update(f"{package}={importlib.metadata.version(package)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{package} absent".encode())
    return digest.hexdigest()[:16]


def build_base(name: str) -> bytes:
    model_name, flavour = name.split(".")
    if flavour in EXECUTORCH_FLAVOURS:
        return _executorch(model_name, lowered=flavour == "et-xnnpack")
    from exirc.compiler import CompileOptions, compile_model, compile_module

    if flavour == "example":  # as `exirc compile examples/<name>.py` makes it
        example = _ROOT / "examples" / f"{model_name}.py"
        return bytes(compile_model(str(example)).data)
    model = MODELS[model_name]
    target, quantize = EXIRC_FLAVOURS.get(flavour, ("portable", None))
    shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    options = CompileOptions(target=target, quantize=quantize, bundle=flavour == "bundled")
    result = compile_module(model.module(), model.example(), dynamic_shapes=shapes,
                            options=options)
    return bytes(result.data)


def _executorch(model_name: str, *, lowered: bool) -> bytes:
    import torch

    # Imported by name: ExecuTorch ships no type information.
    exir = importlib.import_module("executorch.exir")
    model = MODELS[model_name]
    shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    exported = torch.export.export(model.module(), model.example(), dynamic_shapes=shapes,
                                   strict=False)
    if lowered:
        partitioner = importlib.import_module(
            "executorch.backends.xnnpack.partition.xnnpack_partitioner").XnnpackPartitioner
        edge = exir.to_edge_transform_and_lower(exported, partitioner=[partitioner()])
    else:
        edge = exir.to_edge(exported)
    return bytes(edge.to_executorch().buffer)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Compiling warns about deprecations that are not ours to fix."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch", "executorch")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


if __name__ == "__main__":  # python -m tools.mutants.bases FOLDER NAME...: write NAME.pte there
    for built, data in build_bases(sys.argv[2:]).items():
        (Path(sys.argv[1]) / f"{built}.pte").write_bytes(data)
