"""bench.run.format_table: a wide table is cut into blocks that each repeat
the key columns, and no cell is lost or reordered."""

from __future__ import annotations

from bench.run import format_table


def blocks(text: str) -> list[list[list[str]]]:
    """Each block's rows (header first, the dash line dropped), split into cells."""
    return [[line.split() for line in block.splitlines() if not set(line) <= {"-", " "}]
            for block in text.split("\n\n")]


def test_a_narrow_table_is_one_block() -> None:
    text = format_table([{"model": "mlp", "threads": 1, "ms": 0.5}])
    assert blocks(text) == [[["model", "threads", "ms"], ["mlp", "1", "0.5"]]]


def test_a_wide_table_is_cut_into_blocks_repeating_the_keys() -> None:
    rows = [{"model": name, "threads": 2, **{f"engine_{i}_ms": i + k / 10 for i in range(20)}}
            for k, name in enumerate(["mlp", "resnet_tiny"])]
    text = format_table(rows, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    found = blocks(text)
    assert len(found) > 2
    cells: dict[tuple[str, str], str] = {}
    for block in found:
        header, *body = block
        assert header[:2] == ["model", "threads"]
        assert [row[:2] for row in body] == [["mlp", "2"], ["resnet_tiny", "2"]]
        for row in body:
            cells.update({(row[0], column): value for column, value in zip(header[2:], row[2:])})
    assert [column for block in found for column in block[0][2:]] == \
        [f"engine_{i}_ms" for i in range(20)]
    assert cells[("resnet_tiny", "engine_19_ms")] == "19.1"
    assert len(cells) == 40
