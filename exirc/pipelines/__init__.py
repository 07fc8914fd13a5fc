"""Default pass pipelines, one YAML file per target (package data)."""
