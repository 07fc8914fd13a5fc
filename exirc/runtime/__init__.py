"""The reference interpreter: load and run .pte programs."""
