"""The command line: a thin layer over the Python API (`exirc.cli.app:main`)."""
