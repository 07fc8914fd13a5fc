"""The payload reader against hostile bytes.

For any bytes, `deserialize_blob` must either return an XnnpackBlob or raise
`FormatError`: never another exception, never take long. And whatever it
accepts must be writable: `serialize_blob` succeeds on it, and reading that
back and writing again gives the same bytes.

Mutants are deterministic (seeded per base payload): byte flips all over,
truncations, every header field set to hostile values, FlatBuffer words
(offsets, lengths) overwritten, single bytes set to out-of-range tags, and
graph-level mutants (huge dims, unknown node tags) written with the
unchecked writer. A failure names the base, the mutant and the exception.
"""

from __future__ import annotations

import copy
import random
import struct
import time
import traceback
from collections.abc import Iterator

import pytest

from exirc.errors import FormatError
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from exirc.serialize.xnnpack.writer import serialize_blob
from tests.oracle import requires_executorch
from tests.serialize.xnnpack.conftest import RealProgram
from tests.serialize.xnnpack.graphs import GRAPHS_BY_KIND, quantized_graph, raw_payload

K = G.NodeKind
CPU_LIMIT = 0.5  # CPU seconds per mutant (a busy machine does not stretch them); ~1 ms each
_HEADER_FIELDS = ((8, "<H"), (10, "<I"), (14, "<I"), (18, "<I"), (22, "<Q"))


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def byte_mutants(base: bytes, seed: int, count: int = 40) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    n = len(base)
    for pos in sorted(rng.sample(range(n), min(n, count))):
        yield f"flip byte {pos}", _patch(base, pos, "<B", base[pos] ^ 0xFF)
    for pos in sorted(rng.sample(range(n), min(n, count // 2))):
        for value in (0, 0x30, 0xFF):
            yield f"byte {pos} = {value:#x}", _patch(base, pos, "<B", value)
    for cut in sorted({0, 1, 4, 8, 29, 30, 32, 40, n // 3, n // 2, n - 16, n - 1}):
        yield f"truncated to {cut}", base[:max(cut, 0)]
    for offset, fmt in _HEADER_FIELDS:
        for value in (0, 1, 29, 30, 32, n - 1, n, n + 1, 2 ** (8 * struct.calcsize(fmt)) - 1):
            yield f"header word at {offset} = {value}", _patch(base, offset, fmt, value)
    words = range(32, n - 4, 4)
    for pos in sorted(rng.sample(words, min(len(words), count // 2))):
        for value in (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, n, 4):
            yield f"word at {pos} = {value:#x}", _patch(base, pos, "<I", value)
    yield "appended garbage", base + bytes(range(64))


def graph_mutants(blob: G.XnnpackBlob) -> Iterator[tuple[str, bytes]]:
    """Mutants the byte level seldom hits: written with the unchecked writer."""
    blob = G.XnnpackBlob(blob.graph, bytes(blob.constant_region))  # a memoryview can't be copied
    for i in range(len(blob.graph.values)):
        for dims in ([0xFFFFFFFF] * 6, [1] * 9, [65536, 65536], []):
            mutant = copy.deepcopy(blob)
            mutant.graph.values[i].dims = dims
            yield f"value {i} dims {dims[:2]}x{len(dims)}", raw_payload(mutant)
    for i in range(len(blob.graph.nodes)):
        for tag in (0, len(K) + 1, 255):
            mutant = copy.deepcopy(blob)
            mutant.graph.nodes[i].kind = tag  # type: ignore[assignment]
            yield f"node {i} tag {tag}", raw_payload(mutant)
    for i in range(len(blob.graph.constant_data)):
        mutant = copy.deepcopy(blob)
        mutant.graph.constant_data[i].offset = len(blob.constant_region) + 1
        yield f"constant {i} past the region", raw_payload(mutant)
    yield "bare flatbuffer", raw_payload(blob, headed=False)


def _check(name: str, data: bytes) -> str:
    """'ok' or 'refused'; any other outcome fails the test with `name`."""
    start = time.process_time()
    try:
        try:
            blob = deserialize_blob(data)
        except FormatError:
            return "refused"
        once = serialize_blob(blob)
        assert serialize_blob(deserialize_blob(once)) == once, "not a fixed point"
        return "ok"
    except Exception as error:  # noqa: BLE001 - the point is to catch anything
        pytest.fail(f"{name}: {type(error).__name__}: {error}\n{traceback.format_exc()}")
    finally:
        spent = time.process_time() - start
        assert spent < CPU_LIMIT, f"{name}: took {spent:.2f} s of CPU time"


def _run(name: str, base: bytes, seed: int) -> dict[str, int]:
    outcomes = {"ok": 0, "refused": 0}
    for mutation, data in byte_mutants(base, seed):
        outcomes[_check(f"{name}: {mutation}", data)] += 1
    return outcomes


HANDBUILT = {
    "quantized": quantized_graph(),
    "conv": GRAPHS_BY_KIND[K.CONV2D],
    "concat5": GRAPHS_BY_KIND[K.CONCATENATE5],
    "attention": GRAPHS_BY_KIND[K.SCALED_DOT_PRODUCT_ATTENTION],
    "pad": GRAPHS_BY_KIND[K.STATIC_CONSTANT_PAD],
}


@pytest.mark.parametrize("name", HANDBUILT)
def test_mutated_handbuilt_payloads(name: str) -> None:
    blob = HANDBUILT[name]
    outcomes = _run(name, serialize_blob(blob), seed=len(name))
    for mutation, data in graph_mutants(blob):
        outcomes[_check(f"{name}: {mutation}", data)] += 1
    assert outcomes["refused"] > 0 and outcomes["ok"] > 0, outcomes


@requires_executorch
@pytest.mark.oracle
def test_mutated_executorch_payloads(real_programs: dict[str, RealProgram]) -> None:
    outcomes = {"ok": 0, "refused": 0}
    for seed, (name, real) in enumerate(sorted(real_programs.items())):
        for data in real.blobs:
            for outcome, count in _run(name, data, seed).items():
                outcomes[outcome] += count
            for mutation, mutant in graph_mutants(deserialize_blob(data)):
                outcomes[_check(f"{name}: {mutation}", mutant)] += 1
    assert outcomes["refused"] > 0 and outcomes["ok"] > 0, outcomes
