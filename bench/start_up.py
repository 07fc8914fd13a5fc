"""Start-up: how long each command takes to its first output, against its floor.

Per command, on examples/mlp.py: the wall time from spawning the real
`exirc` command to the first byte it writes (stdout or stderr), the median
of `RUNS` runs after one to warm the caches. The reference is the least the
command could take: a bare interpreter for `--version` and `inspect` (which
never import torch), `python -c "import torch"` for `run` and `compile`.
The targets (issue 35): `run` within 0.5 s of `import torch`; `inspect` and
`--version` a fraction of a second.

The children run without PYTHONDONTWRITEBYTECODE, so that they use compiled
bytecode as an installed exirc does; the warm-up run writes it.
"""

from __future__ import annotations

import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ratio

REPO = Path(__file__).resolve().parents[1]
RUNS = 7
BARE = [sys.executable, "-c", "pass"]
IMPORT_TORCH = [sys.executable, "-c", "import torch; print(torch.__version__)"]


def run() -> list[dict[str, Any]]:
    exirc = _exirc_command()
    with tempfile.TemporaryDirectory(prefix="exirc-start-up-") as scratch:
        portable, xnnpack = Path(scratch) / "mlp.pte", Path(scratch) / "mlp_xnnpack.pte"
        model = str(REPO / "examples" / "mlp.py")
        for target, path in (("portable", portable), ("xnnpack", xnnpack)):
            subprocess.run([*exirc, "compile", model, "-q", "--target", target, "-o", str(path)],
                           check=True, capture_output=True, env=_environment())
        bare = first_output_seconds(BARE)
        torch_import = first_output_seconds(IMPORT_TORCH)
        commands = [
            ("--version", [*exirc, "--version"], "bare python", bare),
            ("inspect mlp.pte", [*exirc, "inspect", str(portable)], "bare python", bare),
            ("run mlp.pte --random", [*exirc, "run", str(portable), "--random"],
             "import torch", torch_import),
            ("run mlp_xnnpack.pte --random", [*exirc, "run", str(xnnpack), "--random"],
             "import torch", torch_import),
            ("compile mlp.py", [*exirc, "compile", model, "-o", str(Path(scratch) / "c.pte")],
             "import torch", torch_import),
        ]
        return [_row(name, first_output_seconds(argv), reference, reference_s)
                for name, argv, reference, reference_s in commands]


def first_output_seconds(argv: list[str]) -> list[float]:
    """Seconds from spawning `argv` to its first byte of output, `RUNS` times
    after one warm-up run; the command must succeed."""
    _first_output(argv)
    return [_first_output(argv) for _ in range(RUNS)]


def _first_output(argv: list[str]) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=_environment())
    assert process.stdout is not None and process.stderr is not None
    first = None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        selector.register(process.stderr, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                if os.read(key.fd, 1 << 16):
                    first = first or time.perf_counter() - started
                else:
                    selector.unregister(key.fileobj)  # end of that stream
    if process.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {process.returncode}")
    return first if first is not None else time.perf_counter() - started


def _row(command: str, seconds: list[float], reference: str,
         reference_seconds: list[float]) -> dict[str, Any]:
    ours, theirs = statistics.median(seconds), statistics.median(reference_seconds)
    return {
        "command": command,
        "first output s": ours,
        "min s": min(seconds),
        "reference": reference,
        "reference s": theirs,
        "over reference s": ours - theirs,
        "ratio": ratio(ours, theirs),
    }


def _exirc_command() -> list[str]:
    """The installed `exirc` script beside this interpreter, else `python -m exirc`."""
    script = Path(sys.executable).parent / "exirc"
    return [str(script)] if script.exists() else [sys.executable, "-m", "exirc"]


def _environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items()
            if name != "PYTHONDONTWRITEBYTECODE"}
