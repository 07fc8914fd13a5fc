"""The built-in targets, one per file exirc ships (`exirc/targets/*.yaml`).

Not a test module: tests that compare compiled programs with eager PyTorch
parametrize over these, so a new target is tested the day its YAML lands.
"""

from __future__ import annotations

from exirc.targets import builtin_targets

TARGETS: list[str] = list(builtin_targets())

# The target whose programs use only kernels ExecuTorch's portable runtime has.
PORTABLE = "portable"

# Targets whose pipeline is another's plus passes that bind patterns only some
# models have (xnnpack-llm: xnnpack's, plus binding KV-cache attention to
# ExecuTorch's LLM ops). The zoo-wide tests run their base target; test_zoo
# checks that every zoo model compiles to the base's very bytes under the
# variant, and the models that have the pattern are the variant's own tests
# (tests/backend/test_kv_attention.py, tests/state).
VARIANTS: dict[str, str] = {"xnnpack-llm": "xnnpack"}
ZOO_TARGETS: list[str] = [target for target in TARGETS if target not in VARIANTS]
