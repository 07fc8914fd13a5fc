"""Fixtures of the command-line tests."""

from pathlib import Path

import pytest

from tests.cli.end_to_end import Workshop


@pytest.fixture(scope="session")
def workshop(tmp_path_factory: pytest.TempPathFactory) -> Workshop:
    """The end-to-end tests' model files and programs, each compiled once per session
    (per worker) by the real CLI."""
    directory: Path = tmp_path_factory.mktemp("end_to_end")
    return Workshop(directory)
