"""Plugin modules written by tests: importable while the test runs, gone after."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                  prefix: str) -> Iterator[str]:
    """Write `source` as a module on sys.path under a name unique to the test;
    yields the name (for `module:attr` references), then forgets the module."""
    name = f"{prefix}_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
