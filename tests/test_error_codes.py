"""Every error class has its own stable code (the catalogue's key)."""

from __future__ import annotations

import importlib
import pkgutil

import exirc
from exirc.errors import ExircError


def _all_error_classes() -> list[type[ExircError]]:
    # Import every module so every subclass is defined.
    for module in pkgutil.walk_packages(exirc.__path__, "exirc."):
        if module.name.endswith("__main__") or \
                ".generated" in module.name:
            continue
        importlib.import_module(module.name)
    found, todo = [], [ExircError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_error_codes_are_unique_and_well_formed() -> None:
    classes = _all_error_classes()
    assert len(classes) > 10
    codes: dict[str, str] = {}
    for cls in classes:
        assert cls.code.startswith("E") and len(cls.code) == 5 and cls.code[1:].isdigit()
        assert cls.code not in codes, f"{cls.__name__} reuses {cls.code} of {codes[cls.code]}"
        codes[cls.code] = cls.__name__
