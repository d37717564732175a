# Narwhal: two commands on a fresh machine: `make demo` and `make test`.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest

.PHONY: setup bootstrap test test-fast test-unit test-component test-lab test-real real-capture lint demo clean

setup:
	./scripts/setup-venv.sh

bootstrap:
	./scripts/bootstrap.sh

# Every tier, after bringing the machine up to what the tiers need.
test: bootstrap
	$(PY) -m ruff check src tests
	$(PY) -m mypy
	./scripts/test-tiers.sh

test-fast: setup
	$(PYTEST) -q tests/unit

test-unit: setup
	$(PYTEST) tests/unit

test-component: setup
	$(PYTEST) tests/component

test-lab: bootstrap
	$(PYTEST) tests/lab

# Real vLLM CPU engines; the first run installs the cached vLLM venv (a few minutes).
test-real: bootstrap
	$(PYTEST) tests/real

# Rewrite tests/fixtures/vllm-0.32.0 from a fresh pair of real engines.
real-capture: bootstrap
	$(PY) -m tests.real.capture

lint: setup
	$(PY) -m ruff check src tests
	$(PY) -m mypy

demo: bootstrap
	$(PY) -m narwhal.lab.demo

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache .demo .test-logs
