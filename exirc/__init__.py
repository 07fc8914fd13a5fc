"""exirc: a PyTorch-to-edge compiler driver.

The pipeline, one folder a stage: capture -> aten -> edge -> backend -> plan
-> emit -> serialize -> runtime. The CLI in `exirc.cli` is a thin layer over
the same functions.

Importing `exirc` must not import torch: `exirc --help`, `--version` and
`inspect` answer without it.
"""

__version__ = "0.1.0"
