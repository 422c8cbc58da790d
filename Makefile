# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/vigil: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

.PHONY: demo test lint bench
demo: $(BIN)/vigil
	$(BIN)/vigil serve --demo

test: $(BIN)/vigil
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(BIN)/vigil
	$(BIN)/ruff check service tests bench
	$(BIN)/ruff format --check service tests bench
	$(BIN)/mypy service
	$(BIN)/lint-imports

bench: $(BIN)/vigil
	$(BIN)/python -m bench.bench_pipeline
