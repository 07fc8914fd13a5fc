"""What this machine can give a run now: its available memory (the loader's limit,
and the guards of kernels and delegates whose sizes come from the data)."""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes the system could give us now, or None where we cannot tell."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
