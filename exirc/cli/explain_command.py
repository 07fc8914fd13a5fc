"""`exirc explain`: the long explanation of an error code, or the list of codes."""

from __future__ import annotations

import sys
import textwrap

import click

from exirc.cli.style import Style, styler
from exirc.diagnostics.catalogue import CATALOGUE, closest_codes, lookup
from exirc.diagnostics.error_doc import EXIT_CODES, ErrorDoc
from exirc.errors import UsageError

EPILOG = """\b
Examples:
  exirc explain E0300          what an invalid program file error means
  exirc explain FormatError    the same, by the Python class name
  exirc explain --list         every code with its title
"""

WIDTH = 80  # wrap explanations for a terminal, whatever its width


@click.command("explain", epilog=EPILOG)
@click.argument("code", required=False)
@click.option("--list", "list_codes", is_flag=True, help="List every error code and its title.")
def explain_command(code: str | None, list_codes: bool) -> None:
    """Explain the error code CODE (as printed in `error[E0300]: ...`)."""
    bold = styler(sys.stdout, bold=True)
    if list_codes:
        click.echo(render_list(bold))
        return
    if code is None:
        raise UsageError("give an error code, e.g. `exirc explain E0300`, or --list")
    doc = lookup(code)
    if doc is None:
        raise unknown_code(code)
    click.echo(render_explanation(doc, bold))


def unknown_code(text: str) -> UsageError:
    """The error for a code we do not know, naming the nearest ones we do."""
    nearest = closest_codes(text)
    message = f"unknown error code {text!r}"
    if nearest:
        message += "; the closest known: " + ", ".join(
            f"{code} ({CATALOGUE[code].title})" for code in nearest)
    return UsageError(message, hint="`exirc explain --list` shows every code")


def render_explanation(doc: ErrorDoc, bold: Style) -> str:
    """Title, exit code, class, then meaning, causes, what to do and an example."""
    lines = [bold(f"{doc.code}: {doc.title}"),
             f"exit code: {doc.exit_code} ({EXIT_CODES[doc.exit_code]})",
             f"raised as: {doc.raised_as}",
             "",
             *textwrap.wrap(doc.meaning, WIDTH),
             ""]
    for heading, items in (("Common causes:", doc.causes), ("What to do:", doc.what_to_do)):
        lines.append(bold(heading))
        for item in items:
            lines.extend(textwrap.wrap(item, WIDTH, initial_indent="  - ",
                                       subsequent_indent="    "))
        lines.append("")
    lines.append(bold("Example:"))
    lines.extend("  " + line for line in doc.example.splitlines())
    return "\n".join(lines)


def render_list(bold: Style) -> str:
    """One row per code: code, exit code, title."""
    rows = [bold(f"{'code':<7}{'exit':<6}title")]
    rows.extend(f"{doc.code:<7}{doc.exit_code:<6}{doc.title}"
                for doc in sorted(CATALOGUE.values(), key=lambda doc: doc.code))
    rows.append("")
    rows.append("`exirc explain CODE` explains one.")
    return "\n".join(rows)
