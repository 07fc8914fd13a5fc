"""The real command line, in a process of its own, for the end-to-end tests. Not a test module.

`exirc(...)` runs `python -m exirc`'s `main` on this checkout's code (whatever
directory the test runs from) in a process forked from a warm one
(`tests.warm_exirc`), or with `real=True` in a fresh interpreter, with a
timeout: a cap on a hung child, never a verdict.
`Workshop` compiles each (model, flags) once per test module and runs the
files through `exirc run` and ExecuTorch's runtime. The models are written
as model files, seeded, as a user writes them; every input is drawn from a
seeded generator.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import torch

from tests import warm_exirc

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600  # seconds: a cap on a hung child, generous for a busy 2-core machine

MLP = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 8)).eval()
example_inputs = (torch.randn(4, 16),)
"""

CNN = """\
import torch
from torch import nn

torch.manual_seed(0)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 2 * 2, 10)
        with torch.no_grad():  # batch norm that is not the identity in eval mode
            self.bn.running_mean.uniform_(-0.3, 0.3)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


model = CNN().eval()
example_inputs = (torch.randn(2, 3, 8, 8),)
"""

TINY_LM = """\
import torch
from torch import nn

torch.manual_seed(0)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 48)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.embed(ids))))


model = TinyLM().eval()
example_inputs = (torch.randint(0, 64, (2, 6)),)
"""

MODELS = {"mlp": MLP, "cnn": CNN, "tiny_lm": TINY_LM}


def exirc(*args: str, cwd: Path | None = None,
          real: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m exirc ARGS` on this checkout's code, with a timeout: forked warm
    (`tests.warm_exirc`), or with `real` a fresh interpreter."""
    return warm_exirc.exirc(args, text=True, cwd=cwd, env={**os.environ, "NO_COLOR": "1"},
                            timeout=TIMEOUT, real=real)


def seeded(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def write_npz(path: Path, inputs: Sequence[torch.Tensor]) -> Path:
    arrays: dict[str, Any] = {f"input_{i}": t.numpy() for i, t in enumerate(inputs)}
    numpy.savez(path, **arrays)
    return path


def read_npz(path: Path) -> list[numpy.ndarray]:
    """The arrays of an `exirc run -o` file, in output order (output_0, ...)."""
    with numpy.load(path) as arrays:
        return [arrays[name] for name in arrays.files]


def eager_model(model_file: Path) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The model file's `model` and `example_inputs`, run afresh (the same seeded weights
    the compile saw)."""
    names = runpy.run_path(str(model_file))
    return names["model"].eval(), tuple(names["example_inputs"])


def eager(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_executorch(data: bytes, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """ExecuTorch's runtime on a file, with its quantized kernel library loaded."""
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed::*)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(bytes(data))  # kept alive while the method runs
    outputs = program.load_method("forward").execute([t.clone() for t in inputs])
    return [o.clone() for o in outputs]


class Workshop:
    """Model files, compiled by the real CLI once per (model, flags), and runs of them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._compiled: dict[tuple[str, ...], tuple[Path, str]] = {}
        self._runs = 0

    def model_file(self, name: str) -> Path:
        path = self.directory / f"{name}.py"
        if not path.exists():
            path.write_text(textwrap.dedent(MODELS[name]))
        return path

    def compiled(self, name: str, *flags: str) -> tuple[Path, str]:
        """(file, compile's stderr) of `exirc compile NAME.py FLAGS -o FILE`, compiled once."""
        key = (name, *flags)
        if key not in self._compiled:
            pte = self.directory / f"{name}.{len(self._compiled)}.pte"
            done = exirc("compile", str(self.model_file(name)), *flags, "-o", str(pte))
            assert done.returncode == 0, f"exirc compile {' '.join(key)}: {done.stderr}"
            self._compiled[key] = (pte, done.stderr)
        return self._compiled[key]

    def run(self, pte: Path, inputs: Sequence[torch.Tensor], *flags: str) -> list[torch.Tensor]:
        """`exirc run PTE --inputs in.npz -o out.npz FLAGS`: the outputs."""
        self._runs += 1
        npz = write_npz(self.directory / f"in.{self._runs}.npz", inputs)
        out = self.directory / f"out.{self._runs}.npz"
        done = exirc("run", str(pte), "--inputs", str(npz), "-o", str(out), *flags)
        assert done.returncode == 0, f"exirc run {pte.name} {' '.join(flags)}: {done.stderr}"
        return [torch.from_numpy(a) for a in read_npz(out)]
