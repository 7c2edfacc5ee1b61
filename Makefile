# Every target that runs something first does the whole set-up on a fresh machine, then runs.
# The virtual environment sees the system's packages so that a Gaudi image's own torch build is reused.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done
# the CPU build of torch that is installed only when no torch is importable at all
TORCH_FALLBACK := torch==2.13.0
# the virtual Gaudi stands in only where no real Gaudi software is installed
VIRTUAL_HPU_DEFAULT = $(shell $(PY) -c "import importlib.util as u; print(0 if u.find_spec('habana_frameworks') else 1)")

.PHONY: setup demo test test-heavy lint docs bench clean

setup: $(STAMP)

$(STAMP): setup.py pyproject.toml requirements/*.txt
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(TORCH_FALLBACK)
	$(PY) -m pip install -e ".[test]"
	touch $(STAMP)

demo: setup
	VIRTUAL_HPU=$${VIRTUAL_HPU:-$(VIRTUAL_HPU_DEFAULT)} $(PY) examples/pytorch/hpu_classifier.py --devices 2 --precision bf16-mixed

# two workers (pytest-xdist), each taking whole test files, so that a file's module fixtures and order stay in one
# process; files are handed out in collection order, which starts the slowest (benchmarks, docs, multi-process) early
PYTEST := $(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder
TIERS := and not stress and not bench and not heavy
REHEARSAL = VIRTUAL_HPU=$${VIRTUAL_HPU:-$(VIRTUAL_HPU_DEFAULT)} VIRTUAL_HPU_AS_HARDWARE=$${VIRTUAL_HPU:-$(VIRTUAL_HPU_DEFAULT)}
# The integration tier runs as it will on a Gaudi: on the virtual one it poses as hardware (the rehearsal,
# hpu_testing.rst), so that an integration test reading what only the virtual Gaudi has fails, and the hardware tier
# runs with it on 2 cards (the whole node: `pytest -m hpu`); the virtual tier follows.
# The op sweep compares each op with the CPU bit for bit: it runs in a process of its own, since in a worker that ran
# other suites first, composite ops on hpu were found decomposed into pieces autocast cast (origin not yet found).
test: setup
	$(REHEARSAL) $(PYTEST) --durations=15 -m "not virtual_hpu $(TIERS)" --hpus 2 tests/tests_pytorch
	$(PYTEST) --durations=10 -m "virtual_hpu $(TIERS)" tests/tests_pytorch tests/tests_virtual_hpu \
	  --ignore=tests/tests_virtual_hpu/test_op_sweep.py
	$(PY) -m pytest -n 2 -p no:cacheprovider tests/tests_virtual_hpu/test_op_sweep.py

# the longest scenarios (the `heavy` marker), in the integration tier's posture
test-heavy: setup
	$(REHEARSAL) $(PYTEST) --durations=10 -m "heavy and not virtual_hpu and not stress" --hpus 2 tests/tests_pytorch

lint: setup
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests examples benchmarks

docs: setup
	$(PY) -m pip install -e ".[docs]"
	$(PY) -m sphinx -W -b html docs/source-pytorch docs/build/html

bench: setup
	VIRTUAL_HPU=$${VIRTUAL_HPU:-$(VIRTUAL_HPU_DEFAULT)} $(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build dist docs/build src/*.egg-info
