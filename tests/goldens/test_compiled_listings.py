"""Golden listings of compiled models: what the compiler emits, per target.

Each tiny model in `models/` is compiled for every built-in target and its
`inspect --show summary --show instructions` text compared with
`expected/<model>.<target>.txt`. A restructuring must leave every listing
unchanged; a change to what the compiler emits shows up here as a diff to
review. Regenerating is deliberate: EXIRC_UPDATE_GOLDEN=1 pytest tests/goldens
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from exirc.cli.app import main
from tests.targets import TARGETS

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MODELS = sorted(p.stem for p in (HERE / "models").glob("*.py"))
UPDATE = os.environ.get("EXIRC_UPDATE_GOLDEN") == "1"
# Summary lines about the file's byte layout rather than the compiled program.
_LAYOUT_LINES = ("<file>: program file", "  header:", "  segment ", "size: program")


def _exirc(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(list(args))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", MODELS)
def test_listing_matches_golden(model: str, target: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Source locations in the listing are relative to the working directory.
    monkeypatch.chdir(REPO)
    pte = tmp_path / f"{model}.pte"
    _exirc(capsys, "compile", f"tests/goldens/models/{model}.py", "--target", target,
           "-o", str(pte))
    listing = _exirc(capsys, "inspect", str(pte), "--show", "summary", "--show", "instructions")
    listing = listing.replace(str(pte), "<file>")
    # Frames inside installed packages name the venv's path, not the model's;
    # the file's byte layout (sizes, offsets) depends on how long that path is,
    # so those lines are left out: what the compiler decided is all the rest.
    listing = re.sub(r"\S*/site-packages/", "<site-packages>/", listing)
    listing = "".join(line for line in listing.splitlines(keepends=True)
                      if not line.startswith(_LAYOUT_LINES))
    golden = HERE / "expected" / f"{model}.{target}.txt"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(listing)
    assert golden.exists(), f"no golden for {model} on {target}; run with EXIRC_UPDATE_GOLDEN=1"
    assert listing == golden.read_text(), (
        f"{model} compiled for {target} changed; review the diff and rerun with "
        "EXIRC_UPDATE_GOLDEN=1 if the change is meant")


def test_every_golden_has_a_model() -> None:
    """A golden whose model or target is gone would silently stop being checked."""
    expected = {f"{m}.{t}.txt" for m in MODELS for t in TARGETS}
    present = {p.name for p in (HERE / "expected").glob("*.txt")}
    assert present <= expected, f"stale goldens: {sorted(present - expected)}"
