"""Delegates: the backend interface and registry (`registry`), and the backends
exirc ships (`xnnpack`: ExecuTorch's XnnpackBackend payloads, executed on torch)."""
