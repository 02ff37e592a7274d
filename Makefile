# Two-command set-up: `make demo` and `make test`. Every install step lives here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SRC := actors messages runtime
# mypy follows import names, not setuptools' package-dir: it reads the tree through links laid
# out as the installed package (subagents_node/ <- runtime/ + actors/ + messages/).
TYPECHECK := build/typecheck

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m subagents_node.demo

lint: $(STAMP)
	$(BIN)/ruff check $(SRC) tests bench docs examples
	$(BIN)/ruff format --check $(SRC) tests bench
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/subagents_node
	for entry in runtime/*; do ln -s ../../../$$entry $(TYPECHECK)/subagents_node/; done
	ln -s ../../../actors ../../../messages ../../../examples $(TYPECHECK)/subagents_node/
	cd $(TYPECHECK) && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p subagents_node

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
