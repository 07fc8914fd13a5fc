"""`make bench` is not part of the suite (its numbers are not assertions), but
its modules must keep importing: a moved exirc module breaks them silently."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SECTIONS = sorted(p.stem for p in (Path(__file__).parents[2] / "bench").glob("*.py")
                  if p.stem not in ("__init__",))


@pytest.mark.smoke
@pytest.mark.parametrize("section", SECTIONS)
def test_bench_module_imports(section: str) -> None:
    importlib.import_module(f"bench.{section}")
