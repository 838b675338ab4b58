# sqlbroker — the two commands: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint typecheck docs env postgres chromium faketime bench bench-full faults-long fuzz clean

DEMO_STAMP := $(VENV)/.demo-installed
# pip shows its progress (what it collects and downloads); only the first run installs.
PIP := $(BIN)/python -m pip --disable-pip-version-check

$(BIN)/python:
	@echo "creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)

## The demo needs sqlbroker and its two dependencies (click, rich) and nothing else.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing sqlbroker (click, rich) into $(VENV) for the demo"
	$(PIP) install -e .
	@touch $(DEMO_STAMP)

## Everything the suite needs: every extra and the test tools (about 1.5 GB, first run only).
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing sqlbroker with every extra and the test tools into $(VENV) (about 1.5 GB)"
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[postgres,cron,metrics,dev,spark,faststream,django,celery]'
	@touch $(STAMP) $(DEMO_STAMP)

env: $(STAMP)

## PostgreSQL server binaries for the throwaway test server, and PgBouncer for the pooler
## tests in front of it (Debian's packages; the tests start both themselves).
postgres:
	@if { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; } \
		&& { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing PostgreSQL and PgBouncer (Debian packages postgresql, pgbouncer)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql pgbouncer >/dev/null; \
	else echo "PostgreSQL server binaries or PgBouncer missing: sudo apt-get install postgresql pgbouncer" >&2; exit 1; fi

## Headless Chromium for the dashboard's browser tests (Debian's packages; Playwright drives
## it and never downloads a browser of its own).
chromium:
	@if [ -x /usr/bin/chromium ] && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Chromium (Debian packages chromium, chromium-driver)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "Chromium missing: sudo apt-get install chromium chromium-driver" >&2; exit 1; fi

## libfaketime for the clock-skew fault tests (Debian's package faketime).
faketime:
	@if command -v faketime >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing libfaketime (Debian package faketime)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null; \
	else echo "faketime missing: sudo apt-get install faketime" >&2; exit 1; fi

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check src tests examples bench tools
	$(BIN)/ruff format --check src tests examples bench tools
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

## The documentation site (mkdocs.yml) into site/: --strict, so a broken link or anchor, or a
## public name without a docstring, fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

## The whole suite, PostgreSQL included (slow suites too; CI runs exactly this), then the
## PostgreSQL conformance suite again as a runtime login without DDL rights (~1 minute).
test: $(STAMP) postgres chromium faketime lint typecheck docs
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	SQLBROKER_TEST_PG_ROLE=runtime $(BIN)/python -m pytest -m postgres tests/conformance $(PYTEST_ARGS)

## Everything but the slow suites, for a quick local loop.
test-fast: $(STAMP) postgres chromium faketime
	$(BIN)/python -m pytest -m "not slow and not spark" $(PYTEST_ARGS)

## The fault-injection suites as a longer soak: ten times the messages and durations.
faults-long: $(STAMP) postgres faketime
	SQLBROKER_FAULTS_SCALE=10 $(BIN)/python -m pytest -m slow --timeout=3600 -rP tests/reliability $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo .fuzz site

## A long fuzzing run: each atheris harness for FUZZ_SECONDS (corpus kept in .fuzz/, crashes
## saved there), then the property tests under the long Hypothesis profile.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP) postgres
	@mkdir -p .fuzz/serde .fuzz/topics
	$(BIN)/python tests/fuzz/harness_serde.py .fuzz/serde -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -artifact_prefix=.fuzz/
	$(BIN)/python tests/fuzz/harness_topics.py .fuzz/topics -max_total_time=$(FUZZ_SECONDS) -max_len=1024 -artifact_prefix=.fuzz/
	SQLBROKER_HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest tests/properties --timeout=0 -p no:cacheprovider $(PYTEST_ARGS)

## Quick benchmark against the peers (bench/README.md): SQLite and a durable throwaway
## PostgreSQL, the peers installed into bench/.peers-venv, < 3 minutes.
bench: $(STAMP) postgres
	$(BIN)/python bench/run.py --quick

## The full comparison: default sizes, scale (W4) and a 10-minute soak (W6), ~45 minutes.
bench-full: $(STAMP) postgres
	$(BIN)/python bench/run.py
