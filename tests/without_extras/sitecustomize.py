"""Run Python as if exirc's optional extras were not installed.

`make test` runs the runtime's tests a second time with this folder on
PYTHONPATH and EXIRC_WITHOUT_EXTRAS=1, the configuration a user who installed
exirc without its engines has: onnx, onnxruntime and LiteRT cannot be
imported and `importlib.util.find_spec` does not find them, in the test
process and in every process it starts (the CLI runs). The engines then
refuse with "not installed", `auto` runs the reference interpreter, and tests
that need an engine skip visibly. EXIRC_WITHOUT_EXTRAS may also name the
packages to hide, comma-separated (`torchao`: the quantize extra; ExecuTorch,
the test oracle, needs it, so the runtime's run keeps it).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

ENGINE_PACKAGES = ("onnx", "onnxruntime", "ai_edge_litert", "onnxscript")
_SETTING = os.environ.get("EXIRC_WITHOUT_EXTRAS", "")
BLOCKED = ENGINE_PACKAGES if _SETTING == "1" else tuple(p for p in _SETTING.split(",") if p)


def _blocked(name: str) -> bool:
    return name.split(".")[0] in BLOCKED


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if _blocked(name):
            raise ModuleNotFoundError(f"No module named {name!r} (EXIRC_WITHOUT_EXTRAS)",
                                      name=name)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Absent())
    _find_spec = importlib.util.find_spec

    def _find_spec_without_extras(name: str, package: str | None = None) -> Any:
        return None if _blocked(name) else _find_spec(name, package)

    importlib.util.find_spec = _find_spec_without_extras  # type: ignore[assignment]
