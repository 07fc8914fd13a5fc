"""Shared test configuration, and fixtures more than one test module needs."""

import atexit
import gc
import importlib.util
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "smoke: part of the seconds-long `make check` run")


def pytest_collection_finish(session: pytest.Session) -> None:
    # torch, ExecuTorch and the collected modules leave a test process about a million
    # long-lived objects, which every full garbage collection walked again: a tenth of
    # a compile's time. Frozen, the collector walks what the tests make; a larger first
    # generation makes its passes rarer. (What a test frees without a cycle is freed at
    # once, as before; nothing a verdict reads depends on when the collector runs.)
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def pytest_unconfigure(config: pytest.Config) -> None:
    # After the last report, a test process's exit used to spend seconds on the
    # interpreter's final garbage collection over everything a pass made (millions of
    # objects), which frees nothing the operating system would not: freezing them first
    # (the first exit handler to run) leaves that collection almost nothing to walk.
    atexit.register(gc.freeze)


RUNTIME_TESTS = Path(__file__).parent / "runtime"
ENGINE_TEST_FOLDER = RUNTIME_TESTS / "engines"


def _runs_again_without_extras(item: pytest.Item) -> bool:
    """Whether `make test`'s second pass (the runtime's non-slow tests with the engine
    extras hidden) runs this test on the same interpreter: a runtime test outside
    tests/runtime/engines that runs on the reference (pinned here, `auto` there, which
    with nothing installed is the reference), or the reference case of one taking the
    `engine` fixture."""
    path = Path(str(item.fspath))
    if RUNTIME_TESTS not in path.parents or ENGINE_TEST_FOLDER in path.parents:
        return False
    if item.get_closest_marker("slow") is not None:
        return False
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "engine" in callspec.params:
        return callspec.params["engine"] == "reference"
    return True


# The longest modules (20 s to two minutes of a worker's time each, measured), longest
# first. `make test` gives each module to one xdist worker in collection order, and a
# worker holds the next module while it runs one: a long module handed out late left
# the other worker idle for its last 20-25 s, in each pass. Modules that read the same
# shared files (tests.shared_files) are far apart, so one does not wait on the other:
# test_differential reads test_executorch_models' lowerings, test_load_memory the many
# entries test_bounded_inspect makes.
LONGEST_MODULES = (
    "runtime/delegates/xnnpack/test_executorch_quantized.py",
    "runtime/core/test_mutation_suite.py",
    "runtime/delegates/xnnpack/test_executorch_dynamic.py",  # the second pass's longest
    "quantize/test_zoo_quantized.py",
    "compile/test_zoo.py",
    "runtime/delegates/xnnpack/test_executorch_models.py",
    "inspector/test_bounded_inspect.py",
    "emit/test_constants_once.py",
    "backend/xnnpack/test_decode_nodes.py",
    "quantize/test_dynamic_llms.py",
    "compile/test_zoo_executorch_xnnpack.py",
    "backend/xnnpack/test_quantized_lowering.py",
    "cli/test_end_to_end.py",
    "state/test_cache_patterns.py",
    "state/test_static_cache.py",
    "runtime/engines/test_differential.py",
    "runtime/core/test_load_memory.py",
)


def _longest_first(items: list[pytest.Item]) -> None:
    """The modules of LONGEST_MODULES first, in its order; the rest as collected."""
    tests = Path(__file__).parent
    rank = {tests / name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)), len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first (LONGEST_MODULES). With EXIRC_RUNTIME_AGAIN_WITHOUT_EXTRAS
    set (`make test`'s first pass), leave out the runtime tests its second pass runs on
    the same interpreter, so the suite does not run ~800 tests twice; a plain `pytest`
    still runs everything."""
    _longest_first(items)
    if not os.environ.get("EXIRC_RUNTIME_AGAIN_WITHOUT_EXTRAS"):
        return
    later = [item for item in items if _runs_again_without_extras(item)]
    if later:
        config.hook.pytest_deselected(items=later)
        items[:] = [item for item in items if not _runs_again_without_extras(item)]


@pytest.fixture(autouse=True)
def _the_same_random_state_for_every_test() -> None:
    """Every test starts from seed 0 (torch, numpy, random), whatever ran before it, in
    this process or another worker: its unseeded draws (random inputs, a model's initial
    weights) are the same values on every run, and no verdict depends on test order or
    selection. (Draws made at import time, before any test, take a seeded
    torch.Generator instead.) torch and numpy are seeded only if already imported, so a
    test that imports neither still does not."""
    random.seed(0)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(0)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture(scope="module", autouse=True)
def _one_cia_walk_per_change(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each module's decompositions walk torch's CompositeImplicitAutograd registrations
    once per change, as exirc's ToEdge does (exirc/edge/cia_walks.py), ExecuTorch's
    lowerings (the oracle) included: torch's `run_decompositions` walks them all once
    per op namespace, ~100 times per lowering, 3% of the suite's CPU time. Equivalent
    by construction (a change in the registrations is walked). A module that checks
    torch's own walks sets TORCHS_OWN_CIA_WALKS; a module that never imported torch
    decomposes nothing."""
    if "torch" not in sys.modules or getattr(request.module, "TORCHS_OWN_CIA_WALKS", False):
        yield
        return
    from exirc.edge.cia_walks import cia_walks_on_change

    with cia_walks_on_change():
        yield


@pytest.fixture(scope="session", autouse=True)
def _one_shared_folder_per_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Where `tests.shared_files` keeps what modules make alike: a folder of the
    run's temporary root, which every xdist worker's own root is a folder of; or
    EXIRC_TEST_SHARED, a folder `make test` gives both its passes (the second
    reads ExecuTorch's lowerings the first made) and deletes after them."""
    from tests import shared_files

    given = os.environ.get("EXIRC_TEST_SHARED")
    if given:
        shared_files.set_root(Path(given))
        return
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    shared_files.set_root(root / "shared")


@pytest.fixture()
def add_pte(tmp_path: Path) -> Path:
    """tests.programs.add_constant_program written as a .pte file."""
    from exirc.serialize.writer import serialize
    from tests.programs import add_constant_program

    path = tmp_path / "add.pte"
    path.write_bytes(serialize(add_constant_program()))
    return path


@pytest.fixture()
def chains_on_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fused chains on onnxruntime, not LiteRT: for tests of the ONNX chain's own
    translations (LiteRT takes, by default, every chain it can)."""
    monkeypatch.setenv("EXIRC_ENGINE", "onnxruntime")


def _engine(name: str, package: str) -> object:
    return pytest.param(name, marks=pytest.mark.skipif(
        importlib.util.find_spec(package) is None,
        reason=f"the {name} engine needs {package} installed"))


ENGINES = ["reference", _engine("onnxruntime", "onnxruntime"), _engine("litert", "ai_edge_litert")]
"""What the zoo-wide conformance tests run on: exirc's reference interpreter and
each optional engine (a missing package is a visible skip)."""


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The engine a conformance test checks; load with `load_on(engine, ...)`."""
    return str(request.param)


def load_on(engine: str, source: Any, **limits: Any) -> Any:
    """`exirc.runtime.load(source, engine=engine)`; a program the engine, asked for by
    name, refuses outright (onnxruntime and a quantized delegate) is a visible skip."""
    from exirc.errors import UnsupportedOperatorError
    from exirc.runtime import load

    try:
        return load(source, engine=engine, **limits)
    except UnsupportedOperatorError as error:
        if engine == "reference" or f"asks for {engine}" not in error.message:
            raise
        pytest.skip(f"the {engine} engine does not take this program: {error.message}")



@pytest.fixture(autouse=True)
def _reference_unless_an_engine_is_named(request: pytest.FixtureRequest,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run programs on the reference interpreter unless they name an engine:
    the compiler's tests check the compiler, not whichever engines are installed.
    Engine tests (tests/runtime/engines/, and those taking the `engine` fixture)
    choose their engine themselves; so does `make test`'s run without the engine
    extras (tests/without_extras), where the default, auto, has none to use."""
    if "engine" in request.fixturenames or ENGINE_TEST_FOLDER in Path(request.path).parents:
        return
    if os.environ.get("EXIRC_WITHOUT_EXTRAS"):
        return  # `auto` with no engine installed must be the reference: make test checks it
    monkeypatch.setenv("EXIRC_ENGINE", "reference")
