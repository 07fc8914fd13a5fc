"""Shared test configuration, and fixtures more than one test module needs."""

from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "smoke: part of the seconds-long `make check` run")


@pytest.fixture()
def add_pte(tmp_path: Path) -> Path:
    """tests.programs.add_constant_program written as a .pte file."""
    from exirc.serialize.writer import serialize
    from tests.programs import add_constant_program

    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


@pytest.fixture()
def chains_on_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fused chains on onnxruntime, not LiteRT: for tests of the ONNX chain's own
    translations (LiteRT takes, by default, every chain it can)."""
    monkeypatch.setenv("EXIRC_ENGINE", "onnxruntime")
