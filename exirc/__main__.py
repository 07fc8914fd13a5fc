"""`python -m exirc` works like the `exirc` command."""

from exirc.cli.app import main

raise SystemExit(main())
