"""Every error code exirc uses, explained: the one table behind `exirc explain`.

Each `ExircError` class has a stable code (`exirc.errors`); the CLI prints it
as `error[E0300]: ...` and `exirc explain E0300` prints the entry here. A
test checks this table against the error classes in both directions, so a
new error class cannot ship without its explanation, and an entry cannot
outlive its class.

Codes are grouped by their hundreds, which follow the exit codes: E01xx
internal, E02xx usage, E03xx invalid model or program, E04xx unsupported
operator, E05xx verification mismatch.

The entries are data, `catalogue.yaml` beside this module (each an
`ErrorDoc`, `error_doc`); this module reads them and looks codes up. It
imports nothing from the compiler, so looking a code up never imports torch.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from typing import Any

import yaml

from exirc.diagnostics.error_doc import ErrorDoc


def _read_catalogue() -> tuple[ErrorDoc, ...]:
    text = resources.files(__package__ or "exirc.diagnostics").joinpath(
        "catalogue.yaml").read_text()
    entries: list[dict[str, Any]] = yaml.safe_load(text)
    return tuple(ErrorDoc(**{**entry, "causes": tuple(entry["causes"]),
                             "what_to_do": tuple(entry["what_to_do"])})
                 for entry in entries)


_DOCS = _read_catalogue()

CATALOGUE: dict[str, ErrorDoc] = {doc.code: doc for doc in _DOCS}

_CODE = re.compile(r"^E?(\d{1,4})$", re.IGNORECASE)


def normalize_code(text: str) -> str | None:
    """`E0304`, `e0304`, `0304` and `304` all mean E0304; None if `text` is not a code."""
    match = _CODE.match(text.strip())
    return f"E{int(match.group(1)):04d}" if match else None


def lookup(text: str) -> ErrorDoc | None:
    """The entry for a code (in any spelling) or an error class name, or None."""
    code = normalize_code(text)
    if code is not None:
        return CATALOGUE.get(code)
    wanted = text.strip().lower()
    return next((doc for doc in _DOCS if doc.class_name.lower() == wanted), None)


def closest_codes(text: str, count: int = 3) -> list[str]:
    """The known codes nearest to `text`, nearest first, for "did you mean" messages.

    A numeric code is near codes of its own family (same hundreds) first, then
    by distance: E0305 suggests E0300 and E0310 before E0201. Anything else is
    matched by spelling against codes and class names.
    """
    code = normalize_code(text)
    if code is not None:
        number = int(code[1:])
        return sorted(CATALOGUE, key=lambda known: (int(known[1:]) // 100 != number // 100,
                                                    abs(int(known[1:]) - number),
                                                    known))[:count]
    by_name = {doc.class_name.lower(): doc.code for doc in _DOCS}
    candidates = [*CATALOGUE, *by_name]
    matches = difflib.get_close_matches(text.strip().lower(), [c.lower() for c in candidates],
                                        n=count * 2, cutoff=0.5)
    found: list[str] = []
    for match in matches:
        known = by_name.get(match, match.upper())
        if known not in found:
            found.append(known)
    return found[:count]
