"""`exirc inspect`: what is inside a program file."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import click

from exirc.cli.stdio import is_stdio, read_stdin
from exirc.cli.style import styler
from exirc.inspector.describe import describe
from exirc.inspector.lazy_json import write_json
from exirc.inspector.memory_report import MethodMemory, memory_report
from exirc.inspector.memory_report_text import render_memory
from exirc.inspector.quantization_text import render_quantization
from exirc.inspector.render import instruction_lines, summary_lines
from exirc.inspector.size import size_report
from exirc.inspector.size_text import render_size
from exirc.serialize import read_program_file
from exirc.serialize.data_file import DataFile
from exirc.serialize.data_file.reader import read_data_file
from exirc.serialize.mapped_file import refuse_special_file
from exirc.serialize.reader import map_file
from exirc.serialize.symbolic_shapes import stored_symbolic_shapes

EPILOG = """\b
Examples:
  exirc inspect model.pte                       header, methods, operators, memory, sizes
  exirc inspect model.pte --show instructions   every instruction as SSA text
  exirc inspect model.pte --show memory         arena use: peak, where, fragmentation
  exirc inspect model.pte --show size           every byte of the file, attributed
  exirc inspect model.pte --show quantization   each quantized tensor: scheme, scales, zero points
  exirc inspect model.pte --memory-plan plan.html
  exirc inspect model.pte --json | jq '.methods[0].operators'
  exirc inspect model.pte --data model.ptd      and check its external data file
  exirc compile model.py -o - | exirc inspect -   PATH - reads the program from stdin

The --json shape is versioned ("format_version"); see docs/format.md.
"""

VIEWS = ["summary", "instructions", "memory", "size", "quantization"]


@click.command("inspect", epilog=EPILOG)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True,
              help="Print everything as JSON (with --show memory/size: those reports too).")
@click.option("--show", type=click.Choice(VIEWS), multiple=True,
              help="Views to print (repeatable); default: summary.")
@click.option("--method", "method_name", default=None, help="Only this method.")
@click.option("--data", "data_path", default=None, metavar="FILE.ptd",
              type=click.Path(dir_okay=False, path_type=str),
              help="The program's external data file (.ptd): checked to hold every tensor "
                   "and delegate weight the program reads from it.")
@click.option("--memory-plan", "memory_plan", default=None, metavar="HTML",
              type=click.Path(dir_okay=False, path_type=str),
              help="Write the memory plan as a timeline picture (self-contained HTML).")
def inspect_command(path: str, as_json: bool, show: tuple[str, ...],
                    method_name: str | None, data_path: str | None,
                    memory_plan: str | None) -> None:
    """Show what is inside the program file PATH (ours or ExecuTorch's; - for stdin)."""
    if is_stdio(path):
        data, path = read_stdin("program"), "<stdin>"
    else:
        data = map_file(path)
    program_file = read_program_file(data)
    views = show or ("summary",)
    bold = styler(sys.stdout, bold=True)
    # The size report covers the whole file, so it sees every method even
    # when --method narrows the other views. Each report is turned into what
    # is printed as soon as it is made, so no two are held at once.
    size = size_report(data, program_file) if "size" in views else None
    size_json = size.to_json() if size is not None and as_json else None
    size_text = render_size(size, bold, path=path) if size is not None and not as_json \
        else None
    del size
    if method_name is not None:
        program_file.program.execution_plan = [program_file.program.method(method_name)]
    memory = memory_report(program_file.program) \
        if "memory" in views or memory_plan is not None else None
    if memory_plan is not None:
        assert memory is not None
        _write_memory_plan(Path(memory_plan), memory, title=path)
    info = describe(program_file, path=path, data=_data_file(data_path))
    if as_json:
        if memory is not None and "memory" in views:
            info["memory"] = {"methods": [method.to_json() for method in memory]}
        if size_json is not None:
            # Added to the existing "size" buckets: keys may be added within
            # a format version, never renamed.
            info["size"].update(size_json)
        write_json(info, sys.stdout)  # made and written a part at a time
        return
    memory_text = render_memory(memory, bold) if memory is not None and "memory" in views \
        else None
    del memory
    texts: list[Iterable[str]] = []  # each view's lines, made as they are written
    if "summary" in views:
        texts.append(summary_lines(info, bold))
    if "instructions" in views:
        program = program_file.program
        texts.append(instruction_lines(program.execution_plan, bold,
                                       stored_symbolic_shapes(program), program))
    if memory_text is not None:
        texts.append([memory_text])
    if size_text is not None:
        texts.append([size_text])
    if "quantization" in views:
        texts.append([render_quantization(info, bold)])
    _write_lines(texts)


def _data_file(path: str | None) -> tuple[DataFile, str, int] | None:
    if path is None:
        return None
    refuse_special_file(path, "data file")
    found = read_data_file(path)
    return found, path, os.path.getsize(path)


def _write_lines(views: list[Iterable[str]]) -> None:
    """The views' lines to stdout, a blank line between views, in chunks: a
    listing of a million instructions is never one string."""
    chunk: list[str] = []
    size = 0
    for v, lines in enumerate(views):
        for k, line in enumerate(lines):
            chunk.append(line if not (v and not k) else "\n" + line)
            size += len(line)
            if size > _CHUNK:
                sys.stdout.write("\n".join(chunk) + "\n")
                chunk, size = [], 0
    if chunk:
        sys.stdout.write("\n".join(chunk) + "\n")
    sys.stdout.flush()


_CHUNK = 1 << 16  # characters written at once


def _write_memory_plan(path: Path, memory: list[MethodMemory], *, title: str) -> None:
    from exirc.inspector.memory_report_html import memory_plan_html
    from exirc.serialize.files import write_atomically

    write_atomically(path, memory_plan_html(memory, title=title).encode("utf-8"))
    click.echo(f"wrote the memory plan to {path}", err=True)
