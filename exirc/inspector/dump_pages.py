"""The compiled program as a pass dump directory (--dump-dir) shows it: the
memory plan page and the listing, the same as `exirc inspect --memory-plan`
and `--show instructions` show of the written file."""

from __future__ import annotations

from exirc.inspector.memory_report import memory_report
from exirc.inspector.memory_report_html import memory_plan_html
from exirc.inspector.render import render_instructions
from exirc.serialize import program as P
from exirc.serialize.symbolic_shapes import stored_symbolic_shapes


def memory_plan_page(program: P.Program, *, title: str) -> str:
    """The HTML memory plan of every method (what `inspect --memory-plan` writes)."""
    return memory_plan_html(memory_report(program), title=title)


def listing_text(program: P.Program) -> str:
    """Every method's instructions (what `inspect --show instructions` prints)."""
    return render_instructions(program.execution_plan, str,
                               stored_symbolic_shapes(program), program) + "\n"
