VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint format install

run: $(VENV)/.installed
	$(PY) scripts/run_local.py

# PostgreSQL and Redis: DATABASE_URL / REDIS_URL when set; else the local PostgreSQL on 5432 when it answers, else an
# embedded one, and a Redis of the session's own (tests/settings.py), as `make run` does.
test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

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
