"""Developer-only generators: they write files the package ships, and are not part of it."""
