"""`exirc passes`: the built-in passes, from their own docstrings and options.

Each pass documents itself (its docstring states the dialect it takes and
returns; its dataclass fields are its options), so this listing cannot drift
from the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import textwrap
from typing import Any

import click

from exirc.cli.style import styler
from exirc.errors import UsageError

EPILOG = """\b
Examples:
  exirc passes                       every built-in pass, by stage
  exirc passes constant_fold         one pass: its documentation and options
  exirc passes --json                the same as data
  exirc compile m.py --print-pipeline    the pipeline a compile would run
"""


@click.command("passes", epilog=EPILOG)
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the passes as JSON.")
def passes_command(name: str | None, as_json: bool) -> None:
    """List the built-in passes a pipeline file can name, or explain the pass NAME."""
    from exirc.pipelines import BUILTIN_PASSES

    classes = dict(BUILTIN_PASSES)
    if name is not None:
        if name not in classes:
            raise UsageError(f"no built-in pass {name!r}",
                             hint=f"built-in passes: {', '.join(classes)}")
        classes = {name: classes[name]}
    described = [describe_pass(pass_name, cls) for pass_name, cls in classes.items()]
    if as_json:
        click.echo(json.dumps({"passes": described}, indent=2))
    elif name is not None:
        click.echo(render_one(described[0]))
    else:
        click.echo(render_list(described))


def describe_pass(name: str, cls: type) -> dict[str, Any]:
    """A pass as data: its name, stage package, documentation and options."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    options = [{"name": f.name, "type": str(f.type), "default": _default(f)}
               for f in dataclasses.fields(cls)]
    return {"name": name, "stage": cls.__module__.split(".")[1],
            "summary": doc.splitlines()[0] if doc else "", "doc": doc,
            "class": f"{cls.__module__}:{cls.__qualname__}", "options": options}


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return None
    return list(value) if isinstance(value, tuple) else value


def _options_text(described: dict[str, Any]) -> list[str]:
    return [f"{option['name']}: {option['type']} = {option['default']!r}"
            for option in described["options"]]


def render_list(passes: list[dict[str, Any]]) -> str:
    """The passes grouped by the stage package that defines them, the packages
    in pipeline order (a backend's ATen-stage passes, such as keep_lstm, live
    with its other passes)."""
    from exirc.passes.pipeline import STAGES

    bold = styler(sys.stdout, bold=True)
    width = max(len(p["name"]) for p in passes) + 2
    lines: list[str] = []
    packages = dict.fromkeys(p["stage"] for p in passes)
    for stage in sorted(packages, key=lambda s: STAGES.index(s) if s in STAGES else len(STAGES)):
        lines.append(bold(stage))
        for p in (p for p in passes if p["stage"] == stage):
            lines.append(f"  {p['name']:<{width}}{p['summary']}")
            lines.extend(f"  {'':<{width}}  option {text}" for text in _options_text(p))
    lines.append("")
    lines.append("`exirc passes NAME` explains one; name a pass of your own as module:attr.")
    return "\n".join(lines)


def render_one(described: dict[str, Any]) -> str:
    """One pass: its docstring, its options and where it is defined."""
    bold = styler(sys.stdout, bold=True)
    options = _options_text(described) or ["none"]
    return "\n".join([
        f"{bold(described['name'])} ({described['stage']} stage, {described['class']})",
        "", textwrap.indent(described["doc"], "  "), "",
        "options:", *(f"  {text}" for text in options)])
