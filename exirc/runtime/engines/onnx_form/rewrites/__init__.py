"""Rewrites of a finished ONNX form: fewer nodes, the same results."""
