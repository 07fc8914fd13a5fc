"""Kernels: what runs each KernelCall, by operator name (`registry`), and the
kernels exirc ships: prim ops, its own backend ops, ExecuTorch's quantized library."""
