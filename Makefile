# The two commands a newcomer needs: `make demo` and `make test`.
# Both install what is missing first (scripts/setup.sh).

PY := .venv/bin/python
PYTEST := .venv/bin/pytest

.PHONY: setup demo test test-fast test-long bench bench-quick lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) -m mount_tool.demo

# Two workers, a test file each at a time: most tests wait on mounts, daemons
# and servers rather than on the CPU. `make test PYTEST_JOBS=0` runs serially.
PYTEST_JOBS ?= 2
test: setup
	@$(PYTEST) -q -n $(PYTEST_JOBS) --dist loadfile

# Storage unit tests only (no FUSE needed).
test-fast: setup
	@$(PYTEST) -q -m "not fuse"

# Longer variants (crash rounds, model-based examples) than CI runs.
test-long: setup
	@VFSD_LONG=1 $(PYTEST) -q -n $(PYTEST_JOBS) --dist loadfile

bench: setup
	@$(PY) bench/fs_bench.py
	@$(PY) bench/eviction_bench.py
	@$(PY) bench/workloads.py
	@$(PY) bench/execute_bench.py

bench-quick: setup
	@$(PY) bench/fs_bench.py --quick
	@$(PY) bench/workloads.py --quick

lint: setup
	@.venv/bin/ruff check vfsd mount_tool tests bench

clean:
	rm -rf .venv build *.egg-info .pytest_cache .hypothesis
