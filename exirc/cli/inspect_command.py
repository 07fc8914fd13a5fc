"""`exirc inspect`: what is inside a program file."""

from __future__ import annotations

import json
import sys

import click

from exirc.cli.style import styler
from exirc.inspector.describe import describe
from exirc.inspector.render import render_instructions, render_summary
from exirc.serialize import read_program_file

EPILOG = """\b
Examples:
  exirc inspect model.pte                       header, methods, operators, memory, sizes
  exirc inspect model.pte --show instructions   every instruction as SSA text
  exirc inspect model.pte --json | jq '.methods[0].operators'

The --json shape is versioned ("format_version"); see README.md.
"""


@click.command("inspect", epilog=EPILOG)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
@click.option("--show", type=click.Choice(["summary", "instructions"]), multiple=True,
              help="Views to print (repeatable); default: summary.")
@click.option("--method", "method_name", default=None, help="Only this method.")
def inspect_command(path: str, as_json: bool, show: tuple[str, ...],
                    method_name: str | None) -> None:
    """Show what is inside the program file PATH (ours or ExecuTorch's)."""
    program_file = read_program_file(path)
    if method_name is not None:
        program_file.program.execution_plan = [program_file.program.method(method_name)]
    info = describe(program_file, path=path)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    bold = styler(sys.stdout, bold=True)
    views = show or ("summary",)
    texts = []
    if "summary" in views:
        texts.append(render_summary(info, bold))
    if "instructions" in views:
        texts.append(render_instructions(program_file.program.execution_plan, bold))
    click.echo("\n\n".join(texts))
