"""`--plugin MODULE`: import a user's module for what it registers (kernels, backends).

`exirc compile` and `exirc run` take the same plugins: at compile time the
kernels a plugin registers tell the kernel check which custom operators will
run; at run time they run them. Backend ops a plugin binds to patterns
(`exirc.backend.ops.bind_pattern_to_op`) get their kernels from
`exirc.compiler.install_backend_kernels`, which both commands call.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from exirc.errors import UsageError


def import_plugin(plugin: str, what: str = "plugin") -> None:
    """Import a module by name, or a .py file by path, for its registrations
    (`what` names it in errors: a plugin, or a module given to --import)."""
    try:
        if plugin.endswith(".py") or os.sep in plugin:
            file = Path(plugin)
            if not file.is_file():
                raise UsageError(f"no such {what} file: {plugin}")
            spec = importlib.util.spec_from_file_location(file.stem, file)
            if spec is None or spec.loader is None:
                raise UsageError(f"cannot import the {what} file {plugin}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[file.stem] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(plugin)
    except ImportError as error:
        raise UsageError(f"cannot import the {what} {plugin!r}: {error}",
                         hint="give a module name on PYTHONPATH, or the path of a .py file"
                         ) from None
    except (UsageError, MemoryError):  # typed already, or reported as memory by the app
        raise
    except Exception as error:  # noqa: BLE001 (the user's module failed while importing)
        from exirc.capture.messages import first_line

        raise UsageError(f"importing the {what} {plugin!r} failed: "
                         f"{type(error).__name__}: {first_line(error)}",
                         hint="fix the module (run `python -c 'import MODULE'` to see the "
                              "traceback), or rerun with --debug") from error
