"""Where an instruction of a method is, said when an error or a profile needs it.

A method names an instruction by its chain and index, its operator, the source
line the compiler recorded and the submodule it came from. Sites are made on
demand: one kept per instruction would cost more memory than the file.
"""

from __future__ import annotations

from collections.abc import Sequence

from exirc.errors import ExircError
from exirc.runtime.core.steps import Site, site_of, with_module
from exirc.runtime.errors import ExecutionError
from exirc.serialize import program as P


class InstructionPlaces:
    """The sites of `plan`'s instructions, and errors that name them (method `name`)."""

    def __init__(self, plan: P.ExecutionPlan, name: str) -> None:
        self.plan, self.name = plan, name
        # Per chain, a module path per instruction (`Method.name_modules`).
        self.modules: Sequence[Sequence[str]] = ()

    def length(self, chain: int) -> int:
        return len(self.plan.chains[chain].instructions)

    def site(self, chain: int, pc: int) -> Site:
        """The site of instruction `pc` of `chain`."""
        paths = self.modules[chain] if chain < len(self.modules) else ()
        return with_module(site_of(self.plan, chain, pc), paths, self.length(chain))

    def sites(self, chain: int) -> list[Site]:
        return [self.site(chain, pc) for pc in range(self.length(chain))]

    def where(self, site: Site) -> str:
        chain = f"chain {site.chain}, " if len(self.plan.chains) > 1 else ""
        return f"{chain}instruction {site.index}"

    def blame(self, chain: int, pc: int, error: Exception) -> Exception:
        """The error to raise for `error`, raised by instruction `pc` of `chain`: a
        typed one as `located` makes it, any other as a located ExecutionError."""
        if isinstance(error, ExircError):
            return self.located(chain, pc, error)
        site = self.site(chain, pc)
        detail = (str(error).strip().splitlines() or [""])[0]
        return ExecutionError(f"while executing {self.where(site)} ({site.label}) of method "
                              f"{self.name!r}: {type(error).__name__}: {detail}{site.origin}")

    def located(self, chain: int, pc: int, error: ExircError) -> ExircError:
        """A kernel's own ExecutionError (a quantized kernel refusing its arguments)
        with the instruction and source line it came from; other typed errors
        (a step limit, a delegate's) already say where, and pass as they are."""
        if type(error) is not ExecutionError or not 0 <= pc < self.length(chain):
            return error
        site = self.site(chain, pc)
        return ExecutionError(f"while executing {self.where(site)} ({site.label}) of method "
                              f"{self.name!r}: {error.message}{site.origin}", hint=error.hint)
