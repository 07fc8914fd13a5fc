"""Every child process a test waits for is waited for with a timeout.

A hung child (a compile that never ends, a pipe nobody closes) must fail its
test, not stall the suite: each `subprocess.run`, `check_output`, `check_call`
and `call` in tests/ names a `timeout=`, and so does each `.wait(...)` and
`.communicate(...)` on a `Popen`. The timeout is a cap, generous for a busy
machine, never the verdict: no test decides by how long something took.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
WAITING = {"run", "check_output", "check_call", "call"}  # subprocess's functions that wait


def _without_timeout(path: Path) -> list[str]:
    """`file:line: call` for each wait in the file that names no timeout."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        function, owner = node.func.attr, ast.unparse(node.func.value)
        named = {keyword.arg for keyword in node.keywords}
        if owner == "subprocess" and function in WAITING:
            missing = "timeout" not in named
        elif function == "wait" and owner != "subprocess":
            missing = not node.args and "timeout" not in named
        elif function == "communicate":
            missing = len(node.args) < 2 and "timeout" not in named
        else:
            continue
        if missing:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:60]}")
    return found


def test_every_child_process_is_waited_for_with_a_timeout() -> None:
    found = [f"{path.parent.relative_to(TESTS.parent)}/{line}"
             for path in sorted(TESTS.rglob("*.py")) for line in _without_timeout(path)]
    assert not found, "waits without a timeout:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_wait(tmp_path: Path) -> None:
    source = tmp_path / "waits.py"
    source.write_text(
        "import subprocess\n"
        "subprocess.run(['true'])\n"
        "subprocess.check_output(['true'], text=True)\n"
        "child = subprocess.Popen(['true'])\n"
        "child.communicate()\n"
        "child.wait()\n"
        "subprocess.run(['true'], timeout=60)\n"
        "child.communicate(None, 60)\n"
        "child.wait(timeout=60)\n")
    assert [line.split(":")[1] for line in _without_timeout(source)] == ["2", "3", "5", "6"]
