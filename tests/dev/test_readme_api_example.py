"""README's Python API example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]


def _python_api_example() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README's Python API section has a python example"
    return block.group(1)


def test_readme_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)  # the example writes its .pte files to the working directory
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    namespace = {"model": model, "x": x, "torch": torch}
    exec(_python_api_example(), namespace)
    torch.testing.assert_close(namespace["outputs"][0], model(x))
    assert {"model.pte", "mlp.pte"} <= {p.name for p in tmp_path.iterdir()}
