"""The inspector: what is inside a `.pte` file, for people and programs."""
