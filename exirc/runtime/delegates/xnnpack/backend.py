"""exirc's implementation of ExecuTorch's `XnnpackBackend`: the delegate runs on torch.

`init` reads the payload (`deserialize_blob` checks its structure), resolves
the weights, and compiles the graph (`compile.compile_graph` checks its
semantics); every problem with the file is found there, as a `FormatError`,
or as an `UnsupportedOperatorError` for what we do not implement. `execute`
(`run.execute`) then only follows the compiled closures.

An optional engine may run the compiled graph faster (`exirc.runtime.engines`:
the loader offers it the handle `init` returns); this backend knows nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exirc.runtime.delegates.xnnpack.compile import CompiledGraph, compile_graph
from exirc.runtime.delegates.xnnpack.constants import ConstantSource
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.serialize.xnnpack.graph import XnnpackBlob
from exirc.serialize.xnnpack.reader import deserialize_blob

if TYPE_CHECKING:
    from exirc.runtime.delegates.registry import BackendInitContext, BackendRegistry
    from exirc.serialize import program as P

BACKEND_ID = "XnnpackBackend"


class XnnpackBackend:
    """The backend behind DelegateCalls whose delegate id is `XnnpackBackend`."""

    def init(self, processed: bytes | memoryview, compile_specs: Sequence[P.CompileSpec],
             context: BackendInitContext | None = None) -> CompiledGraph:
        """Read, check and compile one payload (once, at load)."""
        return self.prepare(deserialize_blob(processed), context)

    def prepare(self, blob: XnnpackBlob, context: BackendInitContext | None = None
                ) -> CompiledGraph:
        """Check and compile a payload already read; named data comes from `context`."""
        where = f"{context.where}.graph" if context is not None else "graph"
        named = context.named_data if context is not None else None
        return compile_graph(blob.graph, ConstantSource(blob.graph, blob.constant_region,
                                                        named, where))

    def execute(self, handle: CompiledGraph, args: list[Any]) -> None:
        """Run on the DelegateCall's arguments (inputs, then outputs written in place)."""
        execute(handle, args)


def register(registry: BackendRegistry) -> None:
    """Register the backend in `registry` unless someone registered their own first."""
    if registry.find(BACKEND_ID) is None:
        registry.register(BACKEND_ID, XnnpackBackend())
