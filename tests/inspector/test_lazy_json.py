"""`write_json` streams exactly the text `json.dumps(document, indent=2)` prints,
through every fast path (flat dicts, scalar lists, short Lazy lists)."""

from __future__ import annotations

import io
import json
import math

import pytest

from exirc.inspector.lazy_json import Lazy, materialize, write_json

DOCUMENTS = [
    {},
    [],
    {"a": 1, "b": -2.5, "c": None, "d": True, "e": "x\u00e9\n\"", "f": [], "g": {}},
    {"live": [0, 1, 2], "empty": Lazy(0, list), "short": Lazy(3, lambda: [1, 2.0, None])},
    {"nested": [{"x": [1, [2, 3]], "y": {"z": [math.inf, -math.inf, 1e300, 0.1]}}]},
    {7: "int key", 2.5: "float key", True: "bool key", None: "none key"},
    {"long": Lazy(100, lambda: range(100)), "dicts": Lazy(2, lambda: [{"k": 1}, {"k": [2]}])},
    [1, "two", [3, [4, {}]], {"five": Lazy(1, lambda: [{"six": 6}])}],
    {"outer": {"inner": {"deep": [[], [[]], {"e": []}]}}},
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_streamed_text_is_json_dumps_indent_2(document: object) -> None:
    out = io.StringIO()
    write_json(document, out)
    assert out.getvalue() == json.dumps(materialize(document), indent=2) + "\n"


def test_nan_is_written_as_json_writes_it() -> None:
    out = io.StringIO()
    write_json({"v": [math.nan], "w": math.nan}, out)
    assert out.getvalue() == json.dumps({"v": [math.nan], "w": math.nan}, indent=2) + "\n"
