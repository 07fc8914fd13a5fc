"""exirc: a PyTorch-to-edge compiler driver.

The pipeline, one folder a stage: capture -> aten -> edge -> backend -> plan
-> emit -> serialize -> runtime. Shared by the stages: `ir` (graph helpers),
`passes` (the pass machinery), `targets` (what each target runs). On top:
`pipelines` (the built-in passes by name), `compiler` (the pipeline as one
function), `diagnostics`, `inspector`, and the CLI in `exirc.cli`, a thin
layer over the same functions. CONTRIBUTING.md has the import rule.

Importing `exirc` must not import torch: `exirc --help`, `--version` and
`inspect` answer without it.
"""

__version__ = "0.1.0"
