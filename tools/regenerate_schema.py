"""Regenerate the FlatBuffers Python bindings from schema/*.fbs (`make schema`).

flatc writes a package tree for the schema's namespace; we keep only the
generated modules, under exirc/serialize/generated/. The test suite runs
`generate()` into a temporary folder and fails when the committed bindings
differ, so they cannot drift from the schema.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = [REPO / "schema" / "program.fbs", REPO / "schema" / "scalar_type.fbs"]
TARGET = REPO / "exirc" / "serialize" / "generated"
# flatc maps the namespace exirc.serialize.generated to this folder.
NAMESPACE_DIR = Path("exirc", "serialize", "generated")


def generate(destination: Path) -> None:
    """Write the bindings for the committed schemas into `destination`."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(["flatc", "--python", "-o", scratch, *map(str, SCHEMAS)], check=True)
        shutil.copytree(Path(scratch) / NAMESPACE_DIR, destination, dirs_exist_ok=True)


def main() -> None:
    shutil.rmtree(TARGET, ignore_errors=True)
    generate(TARGET)
    print(f"regenerated {TARGET.relative_to(REPO)} from {', '.join(s.name for s in SCHEMAS)}")


if __name__ == "__main__":
    main()
