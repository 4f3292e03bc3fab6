# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# A second run reuses the virtual environment, the pip cache and the broker jars.

PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install services kafka-jars kafka-up kafka-down test test-unit lint demo bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]' -c constraints.txt
	touch $@

install: $(STAMP)

kafka-jars: install
	$(PY) -m foreshock.ingest.kafka_local fetch

# System services the integration tests need that pip cannot give (Slurm, munge).
services: kafka-jars
	bash scripts/install-services.sh

kafka-up: kafka-jars
	@$(PY) -m foreshock.ingest.kafka_local up

kafka-down: install
	@$(PY) -m foreshock.ingest.kafka_local down

lint: install
	$(PY) -m ruff check .

# Two test files at a time: most of the suite waits on brokers, servers and child processes.
TEST_WORKERS ?= 2

test: services lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test-unit: install
	$(PY) -m pytest tests/unit

demo: install
	$(VENV)/bin/foreshock demo

bench: kafka-jars
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
