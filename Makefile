# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/vigil: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

.PHONY: demo test lint bench lock
demo: $(BIN)/vigil
	$(BIN)/vigil serve --demo

# The suite runs in one process per core, at most TEST_WORKERS of them.
TEST_WORKERS ?= 4
test: $(BIN)/vigil
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses $(TEST_WORKERS)

lint: $(BIN)/vigil
	$(BIN)/ruff check service tests bench
	$(BIN)/ruff format --check service tests bench
	$(BIN)/mypy service
	$(BIN)/lint-imports

bench: $(BIN)/vigil
	$(BIN)/python -m bench.bench_pipeline
	$(BIN)/python -m bench.bench_hotpath

# Re-pin constraints.txt after changing dependencies in pyproject.toml (uv resolves what pip cannot).
lock: $(BIN)/vigil
	$(BIN)/python -m pip install --quiet uv
	cp constraints.txt constraints.txt.new  # the current pins are uv's preferences: only what must move moves
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 --no-header --quiet -o constraints.txt.new \
	  $$( [ -f /etc/xdg/pip/constraints.txt ] && echo -c /etc/xdg/pip/constraints.txt )
	{ printf '%s\n' "# Pinned versions for a reproducible install: pip install -c constraints.txt -e '.[dev]' (make does this)." \
	  "# pip alone cannot resolve the dev extras (resolution-too-deep); regenerate with: make lock"; \
	  cat constraints.txt.new; } > constraints.txt && rm constraints.txt.new
