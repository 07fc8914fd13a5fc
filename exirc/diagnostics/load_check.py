"""The compiler's last check: the program loads on exirc's own reference interpreter.

`exirc compile` never writes a file its loader would refuse: a write into a
constant (the silent miscompile a non-persistent KV cache once caused), an
argument of the wrong kind, a shape a kernel cannot produce. It loads the
bytes it is about to write, with every check `exirc run` makes except those
about this machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exirc.errors import ExircError, InternalError

if TYPE_CHECKING:
    from exirc.runtime.kernels.registry import KernelRegistry


def check_loadable(data: bytes, kernels: KernelRegistry | None = None,
                   external_data: bytes | None = None) -> None:
    """Refuse to hand out a program that exirc's own loader refuses (a write into a
    constant, an argument of the wrong kind, ...): the compile fails, no file is
    written. The reference interpreter loads it, with every check `exirc run` makes
    but those about this machine: its memory, and the delegation backends it has
    (a delegate for a backend only the device has is the device's to check).
    `external_data`: the data file the weights went to, loaded with it."""
    from exirc.runtime import load
    from exirc.runtime.delegates.registry import BACKENDS, BackendRegistry

    class DeviceBackends(BackendRegistry):
        def find(self, backend_id: str) -> Any:
            return super().find(backend_id) or _UNCHECKED_BACKEND

    try:
        load(data, data=external_data, kernels=kernels, backends=DeviceBackends(BACKENDS),
             engine="reference", machine_limits=False)
    except ExircError as error:
        raise refused_by_own_loader(error) from error


def refused_by_own_loader(error: ExircError) -> InternalError:
    """What the user sees when exirc's loader refuses a program exirc just compiled
    (the load check, or --verify loading it): a bug of exirc or of a custom
    pipeline's pass, never a file to re-create with `exirc compile` (FormatError's
    own hint), the command that just made it."""
    return InternalError(
        f"the compiled program fails exirc's own load checks, so no file was written: "
        f"error[{error.code}]: {error.message}",
        hint="this is a bug in exirc or in a pass of a custom pipeline (--pipeline): "
             "report it with the command you ran and --debug output")


class _UncheckedBackend:
    """Stands in, for the compiler's load check, for a backend this process lacks."""

    def init(self, processed: Any, compile_specs: Any) -> None:
        return None

    def execute(self, handle: Any, args: list[Any]) -> None:
        raise AssertionError("the compiler's load check never runs a program")


_UNCHECKED_BACKEND = _UncheckedBackend()
