"""Which engines may run a loaded program: one object reads the choice.

    reference     exirc's interpreter alone: kernels on torch, XNNPACK payloads on
                  exirc's own executor (`exirc.runtime.delegates.xnnpack`). What
                  `--verify`, `run --check` and the compiler's own checks use.
    auto          (the default) the optional engines where they are installed
                  and take the program exactly: XNNPACK delegates and fused chains
                  on onnxruntime, a fused chain with a delegate on LiteRT when it
                  has a TFLite form; the reference interpreter for the rest.
    onnxruntime   as auto but never LiteRT; an XNNPACK delegate onnxruntime cannot
                  take is an error naming the node (to check that it is used).
    litert        as auto, but LiteRT must be installed.

The choice comes from `load(..., engine=...)` (`exirc run --engine`), else from
the environment variable EXIRC_ENGINE, else auto.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exirc.errors import UsageError

ENGINE_VARIABLE = "EXIRC_ENGINE"
ENGINES = ("reference", "auto", "onnxruntime", "litert")
REFERENCE = "reference"
_OLD_VARIABLE = "EXIRC_XNNPACK_ENGINE"
INSTALL_HINTS = {
    "onnxruntime": "install it with `pip install 'exirc[ort]'`",
    "litert": "install it with `pip install 'exirc[litert]'`",
}


@dataclass(frozen=True)
class EnginePolicy:
    """The engine asked for, where the request came from (for messages), and
    where engines write what they build (`--dump-engine`), if anywhere."""

    requested: str = "auto"
    source: str = "the default"
    dump_dir: Path | None = None

    @classmethod
    def resolve(cls, engine: str | EnginePolicy | None = None,
                dump_dir: str | os.PathLike[str] | None = None) -> EnginePolicy:
        """The policy for `engine` (a name, a policy, or None: EXIRC_ENGINE, else auto)."""
        dump = Path(dump_dir) if dump_dir is not None else None
        if isinstance(engine, EnginePolicy):
            return engine if dump is None else EnginePolicy(engine.requested, engine.source, dump)
        if engine is not None:
            return cls(str(engine).strip().lower(), f"engine={engine!r}", dump)
        if os.environ.get(_OLD_VARIABLE, "").strip():
            raise UsageError(f"{_OLD_VARIABLE} was renamed {ENGINE_VARIABLE}",
                             hint=f"set {ENGINE_VARIABLE} to one of {', '.join(ENGINES)} (its "
                                  "old value torch is now reference), and unset "
                                  f"{_OLD_VARIABLE}")
        value = os.environ.get(ENGINE_VARIABLE, "").strip().lower()
        if value:
            return cls(value, f"{ENGINE_VARIABLE}={os.environ[ENGINE_VARIABLE]!r}", dump)
        return cls("auto", "the default", dump)

    @property
    def is_reference(self) -> bool:
        return self.requested == REFERENCE

    def allows(self, engine: str) -> bool:
        """Whether `engine` ("onnxruntime" or "litert") may run anything."""
        if self.requested == REFERENCE:
            return False
        if engine == "litert":
            return self.requested in ("auto", "litert")
        return True  # onnxruntime: under auto, onnxruntime and litert

    def insists_on(self, engine: str) -> bool:
        """Whether the user asked for `engine` by name: then not using it where it
        should be used is an error, not a quiet fallback."""
        return self.requested == engine

    def why_not(self, engine: str) -> str:
        """Why the policy keeps `engine` out (for `execution` messages)."""
        return f"{self.source} asks for the {self.requested} engine"


REFERENCE_POLICY = EnginePolicy(REFERENCE, "the reference interpreter")
"""For checks that must run exirc's own interpreter: `--verify`, `run --check`."""
