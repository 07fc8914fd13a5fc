"""A line budget: no module of exirc outgrows one concept.

A file past the budget is a file absorbing concerns (the 2,000-line emitter
is how they start); split it by concept rather than raise the number. The
FlatBuffers bindings flatc writes are not ours to split.
"""

from __future__ import annotations

from tests.layout.imports import modules

BUDGET = 400  # lines


def test_no_module_is_over_the_line_budget() -> None:
    over = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name: lines for name, lines in over.items() if lines > BUDGET}
    assert not over, f"modules over {BUDGET} lines: " + ", ".join(
        f"{name} ({lines})" for name, lines in sorted(over.items()))
