# servebench: the two commands are `make run` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV = $(shell scripts/venv.sh)
PY = $(VENV)/bin/python

.PHONY: help venv run test test-fast fuzz lint format bench browser kube k8s-check clean-dev

help:
	@echo "make run        start the portal with a finished demo benchmark (embedded Postgres/Redis)"
	@echo "make test       set up and run the whole test suite"
	@echo "make test-fast  the suite without the slow end-to-end tests (no vLLM server starts)"
	@echo "make fuzz       schemathesis against the live test server (part of make test)"
	@echo "make lint       ruff check + format check"
	@echo "make bench      benchmarks under bench/ (print side-by-side ratios)"
	@echo "make k8s-check  Helm chart, k8s/ manifests and the Kubernetes executor (tests/k8s)"

venv:
	@scripts/venv.sh

browser:
	@scripts/ensure-browser.sh

# A real kube-apiserver + controller-manager, etcd, helm and kubectl for tests/k8s
# (built or fetched once into ~/.cache/servebench/kube; minutes the first time).
kube:
	@scripts/kube-binaries.sh >/dev/null

# helm lint + render, kustomize build, schema validation (Kubernetes 1.37), and the
# executor, chart and manifests against the real control plane from `make kube`.
k8s-check: kube
	$(PY) -m pytest tests/k8s $(PYTEST_ARGS)

run:
	@$(PY) scripts/quickstart.py

test: browser kube
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -m "not fuzz" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory fuzz

# Schemathesis against the live test server: >= 1,000 generated calls, none may get a 5xx.
fuzz:
	$(PY) -m pytest -q tests/portal/test_api_fuzz.py $(PYTEST_ARGS)

test-fast: browser
	$(PY) -m pytest -m "not slow and not fuzz" $(PYTEST_ARGS)

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format:
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench:
	$(PY) bench/harness_overhead.py
	$(PY) bench/portal_scale.py
	$(PY) bench/verdict_aa.py

clean-dev:
	$(PY) -m portal.devservices stop || true
