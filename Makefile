# kb-rerank: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export OPENBLAS_NUM_THREADS ?= 1
export HF_HUB_OFFLINE ?= 1

.PHONY: install demo test test-fast serve clean db-stop

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/kb-rerank demo

serve: install
	$(BIN)/kb-rerank migrate
	$(BIN)/kb-rerank serve --dev

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

db-stop: install
	$(BIN)/kb-rerank db stop

clean:
	-$(BIN)/kb-rerank db stop
	rm -rf .kb-data .pytest_cache
