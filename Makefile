VENV := .venv
PY := $(VENV)/bin/python
# The suite runs against PostgreSQL; override DATABASE_URL to point elsewhere.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/tfdash

.PHONY: run test lint format install

run: $(VENV)/.installed
	$(PY) scripts/run_local.py

test: $(VENV)/.installed
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest $(PYTEST_ARGS)

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
