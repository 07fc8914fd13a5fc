"""`write_json` streams exactly the text `json.dumps(document, indent=2)` prints,
through every fast path (flat dicts, scalar lists, short Lazy lists, template rows)."""

from __future__ import annotations

import io
import json
import math

import pytest

from exirc.inspector.lazy_json import SLOT, Lazy, Template, materialize, write_json

# Rows of every kind a slot can hold, and items of another shape among them;
# constant fields with a `%` (the template is a %-format) and nested lists.
ROW = Template({"id": SLOT, "note": "100% \"kept\"", "bytes": SLOT, "live": [0, 0],
                "tensors": [], "name": SLOT})
ROWS = ROW.rows(6, lambda: [(1, 64, "a"), (2, 2**70, "b\u00e9"), {"other": [1, {}]},
                            (3, 0.5, None), (-4, True, math.inf), (5, 6, "%s %d")])

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
    {"rows": ROWS, "empty": ROW.rows(0, list), "nested": [{"deeper": ROWS}]},
    ROWS,
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


def test_a_row_is_its_template_with_the_slots_filled() -> None:
    (first, *_, last) = list(ROWS)
    assert dict(first) == {"id": 1, "note": '100% "kept"', "bytes": 64, "live": [0, 0],
                           "tensors": [], "name": "a"}
    assert first["bytes"] == 64 and len(first) == 6 and list(first) == list(ROW.fields)
    assert last["name"] == "%s %d"
    assert list(ROWS)[2] == {"other": [1, {}]}  # an item of another shape, as it is


def test_a_slot_holding_a_list_is_still_valid_json() -> None:
    # Slots are meant for scalars; anything else makes the writer walk the row.
    rows = Template({"id": SLOT, "sizes": SLOT}).rows(1, lambda: [(1, [2, 3])])
    out = io.StringIO()
    write_json({"rows": rows}, out)
    assert json.loads(out.getvalue()) == {"rows": [{"id": 1, "sizes": [2, 3]}]}
    assert out.getvalue() == json.dumps(materialize({"rows": rows}), indent=2) + "\n"
