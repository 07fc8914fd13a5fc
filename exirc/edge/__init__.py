"""Stage: edge. ATen dialect -> Edge dialect (core ATen ops, dtype-checked)."""
