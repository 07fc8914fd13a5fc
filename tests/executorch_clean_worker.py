"""ExecuTorch's runtime in a process that never imports its quantized kernels.

Not a test module: `tests/executorch_without_quantized.py` starts this script
once per test process and sends it jobs, one JSON object a line on stdin; it
answers each with one line on stdout, `ANSWER` then JSON: `{"ok": true}` or
`{"ok": false, "error": ...}` (the marker, because a library may print too).
Kept alive between jobs because importing ExecuTorch's runtime takes seconds
(it brings torchao), several times what a job takes.

Jobs: `{"job": "run", "program", "inputs", "outputs"}` (paths; the inputs and
outputs as `torch.save` lists) runs `forward` once; `{"job": "generate",
"program", "prompts", "count", "prefill", "outputs"}` writes greedy tokens as
JSON (see `generate_on_executorch_without_quantized_kernels`).

Standalone on purpose: it imports neither exirc nor the tests, so nothing can
register a kernel library behind the job's back; after every job it checks
that ExecuTorch's quantized library is still absent.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import torch
from executorch.runtime import Runtime

QUANTIZED_LIBRARY = "executorch.kernels.quantized"
ANSWER = "exirc-clean-executorch-answer: "


def load(path: str) -> Any:
    with open(path, "rb") as file:
        return Runtime.get().load_program(file.read())


def run(job: dict[str, Any]) -> None:
    program = load(job["program"])
    outputs = program.load_method("forward").execute(torch.load(job["inputs"]))
    torch.save([output.clone() for output in outputs], job["outputs"])


def generate(job: dict[str, Any]) -> None:
    program = load(job["program"])
    forward = program.load_method("forward")
    first = program.load_method(job["prefill"]) if job["prefill"] else None

    def call(method: Any, tokens: list[int], start: int) -> torch.Tensor:
        positions = torch.arange(start, start + len(tokens))
        return method.execute([torch.tensor([tokens]), positions])[0][0, -1]

    generated = []
    for prompt in job["prompts"]:
        if first is not None:
            logits = call(first, prompt, 0)
        else:
            for position, token in enumerate(prompt):
                logits = call(forward, [token], position)
        tokens: list[int] = []
        while len(tokens) < job["count"]:
            tokens.append(int(logits.argmax()))
            logits = call(forward, [tokens[-1]], len(prompt) + len(tokens) - 1)
        generated.append(tokens)
    with open(job["outputs"], "w") as file:
        json.dump(generated, file)


JOBS = {"run": run, "generate": generate}


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        try:
            JOBS[job["job"]](job)
            if QUANTIZED_LIBRARY in sys.modules:
                raise AssertionError(f"{QUANTIZED_LIBRARY} was imported")
            answer: dict[str, Any] = {"ok": True}
        except Exception:  # every failure goes back to the test that sent the job
            answer = {"ok": False, "error": traceback.format_exc()[-4000:]}
        print(ANSWER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
