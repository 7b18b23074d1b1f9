# Two commands a new user needs:  `make demo` (the main job) and `make test` (the suite).
# Both build .venv on first use: the CPU build of torch first (pinned), then the package.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export NUMBA_THREADING_LAYER ?= workqueue

.PHONY: test test-fast demo lint chromium bench clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	touch $(STAMP)

chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium fonts-liberation >/dev/null)

lint: $(STAMP)
	$(VENV)/bin/ruff check loader dashboard tests examples benchmarks
	$(VENV)/bin/ruff format --check loader dashboard tests examples benchmarks
	$(VENV)/bin/mypy

test: $(STAMP) chromium lint
	@# the kernels once more as plain Python (their twins' twin); numpy warns on the wrapping
	@# uint64 arithmetic that Numba does silently
	NUMBA_DISABLE_JIT=1 $(VENV)/bin/pytest -q -p no:cacheprovider tests/test_kernels.py \
		tests/test_varlen.py::test_ragged_take_matches_twin tests/test_packing.py::test_blocks_match_the_twin \
		tests/test_mixture_plan.py::test_count_kernel_matches_twin \
		tests/test_mixture_plan.py::test_label_kernel_matches_twin \
		tests/test_mixture_plan.py::test_passes_kernel_matches_one_epoch_at_a_time \
		tests/test_pack_fields.py::test_the_kernel_writes_the_twins_fields_it_is_asked_for \
		-W "ignore:overflow encountered:RuntimeWarning"
	$(VENV)/bin/pytest -q --durations=30

# The inner loop: everything that runs in one process, no lint. CI runs `make test`.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -x -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/python examples/main_job.py

bench: $(STAMP)
	bash benchmarks/run.sh

clean-venv:
	rm -rf $(VENV)
