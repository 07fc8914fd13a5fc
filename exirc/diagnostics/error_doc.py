"""What the catalogue says about an error code: the shape of one entry, and
what each exit code an entry names means.

Data only, no torch: `exirc explain` must stay as fast as `--help`.
"""

from __future__ import annotations

from dataclasses import dataclass

# What each process exit code means (also in docs/cli.md and exirc/errors.py).
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "internal error",
    2: "usage error",
    3: "invalid model or program file",
    4: "unsupported operator",
    5: "verification mismatch",
}


@dataclass(frozen=True)
class ErrorDoc:
    """The documentation of one error code."""

    code: str
    title: str
    exit_code: int
    raised_as: str  # the class to catch in Python, e.g. "exirc.errors.FormatError"
    meaning: str
    causes: tuple[str, ...]
    what_to_do: tuple[str, ...]
    example: str  # what the CLI prints, error line and hint

    @property
    def class_name(self) -> str:
        return self.raised_as.rsplit(".", 1)[-1]
