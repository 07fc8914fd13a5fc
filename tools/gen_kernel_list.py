"""Generate the portable kernel list: `exirc/targets/portable_kernels.txt`.

A developer script, run by hand when the ExecuTorch release we target
changes; nothing imports it at compile time:

    python -m tools.gen_kernel_list

It needs the test oracle installed (`pip install --no-deps executorch==1.5.1`,
as `make install` does): the list is the list of operators the portable
runtime of that release registers, read from its Python bindings
(`portable_lib._get_operator_names()`), one `namespace::name.overload` a line
(the overload left out for a default overload, as ExecuTorch names them),
sorted. Only the names are taken; exirc itself never imports ExecuTorch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path

LIST = Path(__file__).resolve().parents[1] / "exirc" / "targets" / "portable_kernels.txt"


def portable_operator_names() -> list[str]:
    """The operators ExecuTorch's portable runtime registers, sorted."""
    portable_lib = importlib.import_module("executorch.extension.pybindings.portable_lib")
    return sorted(set(portable_lib._get_operator_names()))


def main() -> int:
    version = importlib.metadata.version("executorch")
    names = portable_operator_names()
    LIST.write_text("\n".join(names) + "\n")
    print(f"wrote {LIST.name}: {len(names)} operators of ExecuTorch {version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
