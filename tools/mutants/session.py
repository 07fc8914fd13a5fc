"""What a run of mutants needs before the first one: the base programs
(cached), the operator catalog, and the modules the fork server imports.

Finding those modules (`warm.discover`, a throwaway process driving one base
through every stage) overlaps with building the other bases, which is most
of the seconds a run spends before its first mutant.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tools.mutants import warm
from tools.mutants.bases import cached_bases
from tools.mutants.catalog import Catalog, build_catalog

WARM_BASE = "mlp.portable"  # drives every stage; other bases import nothing more


@dataclass
class Session:
    bases: dict[str, bytes]
    catalog: Catalog
    warm_modules: list[str]


def prepare(names: Sequence[str], cache: Path) -> Session:
    """The bases `names` (built or from `cache`), the catalog, the warm list."""
    first = cached_bases([WARM_BASE], cache)
    with ThreadPoolExecutor(max_workers=1) as pool:
        modules = pool.submit(warm.discover, [first[WARM_BASE]])
        bases = cached_bases(names, cache)
        catalog = build_catalog()
        return Session(bases, catalog, modules.result())
