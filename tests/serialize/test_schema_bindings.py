"""The committed FlatBuffers bindings match what flatc makes of schema/*.fbs."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from tools.regenerate_schema import PACKAGES, Bindings, flatc, generate


@pytest.mark.skipif(flatc() is None, reason="flatc (dev extra) not installed")
@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.namespace)
def test_generated_bindings_match_schema(tmp_path: Path, package: Bindings) -> None:
    generate(tmp_path, package)
    fresh = sorted(p.name for p in tmp_path.glob("*.py"))
    committed = sorted(p.name for p in package.target.glob("*.py"))
    assert fresh == committed, "tables added or removed: run `make schema`"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, package.target, fresh, shallow=False)
    assert not mismatch and not errors, f"bindings drifted: {mismatch}; run `make schema`"
