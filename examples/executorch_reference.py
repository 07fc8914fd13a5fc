"""Write ExecuTorch's own .pte of the example MLP, for `exirc inspect` to read.

    python examples/executorch_reference.py out/mlp_executorch.pte

ExecuTorch is the project's format oracle (installed by `make install`, never
a dependency of exirc): files it writes must read in exirc, and ours in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from mlp import example_inputs, model  # noqa: E402


def main() -> None:
    try:
        from executorch.exir import to_edge
    except ImportError:
        print("ExecuTorch is not installed; run `make install` first")
        raise SystemExit(2) from None
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "out/mlp_executorch.pte")
    path.parent.mkdir(parents=True, exist_ok=True)
    program = to_edge(torch.export.export(model, example_inputs)).to_executorch()
    path.write_bytes(program.buffer)
    print(f"wrote {path} ({len(program.buffer)} bytes) with ExecuTorch's to_executorch()")


if __name__ == "__main__":
    main()
