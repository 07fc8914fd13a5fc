"""Stage: backend. Edge dialect -> Backend dialect (target ops bound to patterns)."""
