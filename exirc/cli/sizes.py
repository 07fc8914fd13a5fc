"""One grammar for memory sizes on the command line (`--max-arena`, `--max-memory`).

A size is a number of bytes, or a number (decimals allowed) with a unit:
K, M, G or T, each optionally followed by B or iB, all binary (1K = 1024
bytes) and case-insensitive: `1000000`, `512K`, `64M`, `1.5G`, `1GiB`,
`2gb`. Memory is counted in powers of two, and `exirc run --max-memory`
always read `MB` as MiB, so `KB`/`MB`/`GB` mean the same here.
"""

from __future__ import annotations

import re
from decimal import Decimal

import click

from exirc.errors import UsageError

SIZE_HELP = ("SIZE is bytes, or a number with K, M, G or T (binary: 1K = 1024; KiB and KB "
             "are the same), e.g. 1000000, 512K, 64M, 1.5G, 1GiB.")

_UNITS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(I?B)?", re.IGNORECASE)


def parse_size(text: str, option: str) -> int:
    """The bytes `text` means (a fraction of a byte rounds down); UsageError
    naming `option` when it is not a size."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or (match[3] and match[3].upper() == "IB" and not match[2]):
        raise UsageError(f"{option}: {text!r} is not a size",
                         hint="give bytes, or a number with K, M, G or T (binary): e.g. "
                              "1000000, 512K, 64M, 1.5G, 1GiB")
    return int(Decimal(match[1]) * 1024 ** _UNITS[match[2].upper()])


def size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """click callback: the option's SIZE in bytes, or None when not given."""
    if value is None:
        return None
    return parse_size(value, param.opts[0] if param.opts else "SIZE")
