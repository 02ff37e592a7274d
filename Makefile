# Two-command set-up: `make demo` and `make test`. Every install step lives here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SRC := actors messages runtime

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m runtime.demo

lint: $(STAMP)
	$(BIN)/ruff check $(SRC) tests bench
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/mypy $(SRC)

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
