"""`make bench`: exirc measured against torch eager and ExecuTorch, in one run.

Each section is a module in bench/ with `run() -> list[dict]`; every row
names what it measured, exirc's figure, the reference's figure and their
ratio (exirc / reference: below 1 is better for times and sizes). The run
prints one table per section and writes everything to
`<out>/bench.json`. Numbers come from this machine at this moment: compare
ratios, not absolute times, across machines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Sections run in this order; a missing module (not written yet) is skipped.
SECTIONS = ["bench.start_up", "bench.serialization", "bench.inspector", "bench.overhead",
            "bench.runtime",
            "bench.compile", "bench.file_size", "bench.control_flow", "bench.delegation",
            "bench.quantization", "bench.side_by_side", "bench.llm"]


def format_table(rows: list[dict[str, Any]], *, width: int = 120, keys: int = 2) -> str:
    """The rows as an aligned table; one wider than `width` characters is cut
    into blocks of columns, each repeating the first `keys` columns (the
    model, the thread count) so that a block can be read on its own."""
    if not rows:
        return "  (no rows)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = {c: [_cell(row.get(c)) for row in rows] for c in columns}
    widths = {c: max(len(c), *(len(v) for v in cells[c])) for c in columns}
    key_columns, rest = columns[:keys], columns[keys:]
    blocks: list[list[str]] = []
    used = sum(widths[c] + 2 for c in key_columns)
    for column in rest:
        if not blocks or (used + widths[column] + 2 > width and len(blocks[-1]) > keys):
            blocks.append(list(key_columns))
            used = sum(widths[c] + 2 for c in key_columns)
        blocks[-1].append(column)
        used += widths[column] + 2
    lines: list[str] = []
    for block in blocks or [key_columns]:
        if lines:
            lines.append("")
        lines.append("  " + "  ".join(c.ljust(widths[c]) for c in block))
        lines.append("  " + "  ".join("-" * widths[c] for c in block))
        lines += ["  " + "  ".join(cells[c][i].rjust(widths[c]) for c in block)
                  for i in range(len(rows))]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--only", action="append", help="run only these sections")
    args = parser.parse_args()

    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "sections": {},
    }
    for name in SECTIONS:
        short = name.split(".")[-1]
        if args.only and short not in args.only:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue
        started = time.perf_counter()
        rows = module.run()
        report["sections"][short] = rows
        print(f"\n== {short} ({time.perf_counter() - started:.1f} s)")
        print(format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
