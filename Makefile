VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test test-serial test-fast test-parallel lint format install dist

run: $(VENV)/.installed
	$(PY) scripts/run_local.py --exit-with-parent

# PostgreSQL and Redis: DATABASE_URL / REDIS_URL when set; else the local PostgreSQL on 5432 when it answers, else an
# embedded one, and a Redis of the session's own (tests/settings.py), as `make run` does. Two pytest-xdist workers:
# the tests whose agents run TensorFlow on loopback on one, one at a time; the rest on the other (tests/conftest.py,
# _worker_group), each with its own databases, Redis and half of the task uids. Figures: docs/sizing.md.
test: $(VENV)/.installed
	$(PY) -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# The same suite in one process (slower; a traceback reads in order, and pdb works).
test-serial: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# Kept for scripts written when two workers were not the default.
test-parallel: test

# The inner loop's tier: unit, API and contract tests, without the slow kinds (pyproject.toml's markers: TensorFlow
# processes, the control plane's processes, browser, bench, soak, network namespaces, slow by design), which
# tests/conftest.py gives each test from its path and fixtures. A test of this tier that loads TensorFlow fails.
# `make test` runs these and all the others; `-m` selects a kind alone (PYTEST_ARGS='-m "tf and not bench"').
# Two workers, each test to whichever is free (`--dist load`: none of these needs the cores or ports of its own that
# `make test`'s groups give the TF tests): 2 min 1 s against 3 min 4 s in one process on 2026-11-29
# (docs/development/testing.md). `make test-serial PYTEST_ARGS=...` for one process.
test-fast: $(VENV)/.installed
	TFDASH_TEST_TIER=fast $(PY) -m pytest -n 2 --dist load $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh

# The agent's and the CLI's wheels (agent/pyproject.toml, client/pyproject.toml) into dist/, for hosts and laptops
# that install them without a checkout: `pip install dist/tfdash_agent-*.whl`.
dist: $(VENV)/.installed
	$(PY) -m pip wheel --no-deps --wheel-dir dist ./agent ./client

# The docs site (Sphinx + MyST + furo, docs/conf.py) into build/docs/, strict: any warning (a broken link or anchor, a
# page in no toctree) fails it, as tests/test_docs.py does in the suite. Open build/docs/index.html.
.PHONY: docs
docs: $(VENV)/.installed
	$(PY) -m sphinx -W --keep-going -n -b html docs build/docs
