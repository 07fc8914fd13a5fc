"""The `exirc` command: subcommands, error reporting and exit codes.

Data goes to stdout; messages go to stderr. A failure prints one line with
the error code and a hint; `--debug` adds the traceback. Exit codes are
those of `exirc.errors`. Nothing here imports torch: `--help`, `--version`
and `inspect` stay fast, and commands that need torch import it lazily.
Each subcommand's module is imported only when that subcommand runs (or
`--help` lists them), so none pays for another's imports.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import traceback
import warnings

import click

from exirc import __version__
from exirc.cli.style import styler
from exirc.errors import ExircError, InternalError, ResourceError, UsageError

EPILOG = """\b
Examples:
  exirc compile model.py -o model.pte       compile a PyTorch model
  exirc inspect model.pte                   what is inside a program file
  exirc inspect model.pte --show instructions
  exirc inspect model.pte --json            everything, for programs
  exirc explain E0300                       what an error code means
  exirc passes                              the built-in passes a pipeline can name

\b
Exit codes: 0 ok, 1 internal error, 2 usage, 3 invalid model or program
file, 4 unsupported operator, 5 verification mismatch.
"""


SUBCOMMANDS = {
    "compile": "exirc.cli.compile_command:compile_command",
    "explain": "exirc.cli.explain_command:explain_command",
    "generate": "exirc.cli.generate_command:generate_command",
    "inspect": "exirc.cli.inspect_command:inspect_command",
    "passes": "exirc.cli.passes_command:passes_command",
    "run": "exirc.cli.run_command:run_command",
}
"""Each subcommand's click command, as `module:attribute`."""


class _Subcommands(click.Group):
    """The subcommands of SUBCOMMANDS, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = SUBCOMMANDS.get(cmd_name)
        if where is None:
            return None
        module, _, attribute = where.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Subcommands, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="exirc")
@click.option("--debug", is_flag=True,
              help="Show the full traceback on errors (also after the subcommand, or "
                   "EXIRC_DEBUG=1).")
def cli(debug: bool) -> None:
    """exirc: compile PyTorch models to .pte programs, inspect and run them."""


def report_error(error: ExircError, debug: bool, as_json: bool = False) -> None:
    """The error on stderr (one line, hint, where to read more); with `as_json`,
    also as a JSON error object on stdout, for programs reading --json."""
    if as_json:
        from exirc.cli.json_output import error_document

        try:
            sys.stdout.write(json.dumps(error_document(error), indent=2) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass  # stdout is gone: stderr still says it
    red = styler(sys.stderr, fg="red", bold=True)
    print(f"{red('error')}[{error.code}]: {error.message}", file=sys.stderr)
    if error.hint:
        print(f"  hint: {error.hint}", file=sys.stderr)
    print(f"  see: exirc explain {error.code}", file=sys.stderr)
    if debug:
        traceback.print_exception(error, file=sys.stderr)


# Options a user may give before or after the subcommand: `--debug` is the
# group's (every hint says "rerun with --debug"), -q and -v the subcommand's.
_ANYWHERE = frozenset({"--debug"})
_SUBCOMMAND_FLAGS = frozenset({"-q", "--quiet", "-v", "--verbose"})


def normalize_arguments(args: list[str]) -> tuple[list[str], bool]:
    """(arguments as click takes them, debug): `--debug` anywhere before `--` (or
    EXIRC_DEBUG=1) turns on tracebacks; -q/-v before the subcommand go after it."""
    import os

    end = args.index("--") if "--" in args else len(args)
    debug = any(a in _ANYWHERE for a in args[:end]) or \
        os.environ.get("EXIRC_DEBUG", "") not in ("", "0")
    head = [a for a in args[:end] if a not in _ANYWHERE]
    moved: list[str] = []
    while head and head[0] in _SUBCOMMAND_FLAGS:
        moved.append(head.pop(0))
    if moved and head and not head[0].startswith("-"):
        head[1:1] = moved  # after the subcommand's name
    else:
        head[:0] = moved  # no subcommand: click reports the unknown option
    return head + args[end:], debug


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for JSON (`--json` before any `--`)."""
    end = args.index("--") if "--" in args else len(args)
    return "--json" in args[:end]


def _subcommand(args: list[str]) -> str:
    return next((a for a in args if not a.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code (never raises)."""
    args, debug = normalize_arguments(list(sys.argv[1:] if argv is None else argv))
    as_json = _wants_json(args)
    quiet_environment: dict[str, str] = {}
    if not debug:
        # torchao, which transformers imports when it is installed, warns on
        # stderr about its optional CUDA kernels on every import, and makes
        # torch's pytree log a deprecation: not the user's business.
        noisy = ["torchao", "torch.utils._pytree"]
        if any(a in ("-q", "--quiet") for a in args):
            noisy += ["torch", "transformers"]  # -q: their own logging too
            # transformers sets its logger's level when first imported (by the
            # model file, later): this is the level it will set.
            quiet_environment["TRANSFORMERS_VERBOSITY"] = "error"
        for name in noisy:
            logging.getLogger(name).setLevel(logging.ERROR)
    saved = {name: os.environ.get(name) for name in quiet_environment}
    os.environ.update(quiet_environment)
    try:
        with warnings.catch_warnings():
            if not debug and not any(a in ("-v", "--verbose") for a in args):
                # torch's and numpy's warnings (a deprecation, a buffer that is
                # not writable) around a one-line error only bury it; exirc
                # tells users things through its own messages, not warnings.
                warnings.simplefilter("ignore")
            result = cli.main(args=args, prog_name="exirc", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show(file=sys.stderr)
        if as_json:  # a bad command line, as the JSON reader sees it
            from exirc.cli.json_output import error_document

            print(json.dumps(error_document(UsageError(error.format_message())), indent=2))
        return 2
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except ExircError as error:
        report_error(error, debug, as_json)
        return error.exit_code
    except BrokenPipeError:
        return 0  # `exirc inspect x.pte | head` is not an error
    except MemoryError as error:
        # Commands say what they were doing when they can (a ResourceError);
        # this is for the rest, which is never a bug report.
        resource = ResourceError(f"out of memory while running `exirc {_subcommand(args)}`",
                                 hint="free memory, or give it smaller inputs or a smaller "
                                      "model; --debug shows where it happened")
        resource.__traceback__ = error.__traceback__
        report_error(resource, debug, as_json)
        return resource.exit_code
    except Exception as error:  # noqa: BLE001  (the last line of defence)
        internal = InternalError(f"{type(error).__name__}: {error}")
        internal.__traceback__ = error.__traceback__
        report_error(internal, debug, as_json)
        if not debug:
            print("  rerun with --debug to see the traceback", file=sys.stderr)
        return internal.exit_code
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
