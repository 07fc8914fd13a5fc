"""pytest's warning filters (pyproject.toml) hide third-party chatter about
third-party internals, and nothing exirc itself says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Each warning as the library raises it: (module it is attributed to, category, message).
THIRD_PARTY = [
    ("executorch.exir.dialects.edge._ops", "DeprecationWarning",
     "read_text is deprecated. Use files() instead."),
    ("importlib.resources._legacy", "DeprecationWarning",
     "open_text is deprecated. Use files() instead."),
    ("executorch.exir._serialize._flatbuffer", "DeprecationWarning",
     "read_binary is deprecated. Use files() instead."),
    ("executorch.extension.pybindings.portable_lib", "UserWarning",
     "This API is experimental and subject to change without notice."),
    ("executorch.exir.emit._emitter", "UserWarning",
     "Mutation on a buffer in the model is detected. ExecuTorch assumes buffers ..."),
    ("torch.jit._script", "DeprecationWarning",
     "`torch.jit.script_method` is deprecated. Please switch to `torch.compile`."),
    ("copyreg", "FutureWarning",
     "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)`"),
    ("contextlib", "UserWarning",
     "The tensor attributes self.lstm._flat_weights[0], self.lstm._flat_weights[1] were "
     "assigned during export. Such attributes must be registered as buffers"),
    ("transformers.modeling_utils", "FutureWarning", "something is deprecated"),
    ("torchao.quantization", "DeprecationWarning", "something is deprecated"),
]
# The same messages from exirc's own modules must still show.
OURS = [("exirc.capture.load", category, message) for _, category, message in THIRD_PARTY]


def _warnings_summary(tmp_path: Path, warnings: list[tuple[str, str, str]]) -> str:
    """Run pytest with the project's configuration on a test that raises `warnings`."""
    lines = ["import warnings", "", "def test_warns():"]
    for module, category, message in warnings:
        lines.append(f"    warnings.warn_explicit({message!r}, {category}, 'x.py', 1, "
                     f"module={module!r})")
    test_file = tmp_path / "test_raises_warnings.py"
    test_file.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), str(test_file)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_third_party_warnings_are_filtered(tmp_path: Path) -> None:
    out = _warnings_summary(tmp_path, THIRD_PARTY)
    assert "warnings summary" not in out, out
    assert "1 passed" in out


def test_the_same_warnings_from_exirc_still_show(tmp_path: Path) -> None:
    out = _warnings_summary(tmp_path, OURS)
    assert "warnings summary" in out
    assert f"1 passed, {len(OURS)} warnings" in out, out
