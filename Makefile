# servebench: the two commands are `make run` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV = $(shell scripts/venv.sh)
PY = $(VENV)/bin/python

.PHONY: help venv run stop test test-fast fuzz lint format bench browser kube k8s-check k8s-images k8s-e2e gpu-check clean-dev

help:
	@echo "make run        start the portal with a finished demo benchmark (embedded Postgres/Redis)"
	@echo "make stop       stop what make run started (from another shell; Ctrl-C does the same)"
	@echo "make test       set up and run the whole test suite"
	@echo "make test-fast  the suite without the slow end-to-end tests (no vLLM server starts)"
	@echo "make fuzz       schemathesis against the live test server (part of make test)"
	@echo "make lint       ruff check + format check"
	@echo "make bench      benchmarks under bench/ (print side-by-side ratios)"
	@echo "make k8s-check  Helm chart, k8s/ manifests and the Kubernetes executor (tests/k8s)"
	@echo "make k8s-e2e    the chart on a real one-node cluster with the Dockerfile's images (tests/k8s_e2e)"
	@echo "make gpu-check  on an NVIDIA machine: NVML, HF baselines (and vLLM), J/token, power, roofline vs anchors"

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

# What tests/k8s_e2e runs: kubelet, kube-scheduler and pause from the same Debian source as
# `make kube` (its one Go build makes them), containerd/runc/buildah/CNI from Debian, and
# the Dockerfile's two images built with buildah from locally made bases (cached in
# ~/.cache/servebench, keyed by content; each phase's time is printed). Root, and minutes
# the first time.
k8s-images: kube
	@scripts/kube-node.sh --pause >/dev/null
	@start=$$SECONDS; scripts/kube-node.sh >/dev/null & node=$$!; \
	scripts/build-images.sh >/dev/null; images=$$?; wait $$node; node_rc=$$?; \
	echo "k8s-images: node binaries and images took $$((SECONDS - start)) s" >&2; \
	[ $$images = 0 ] && [ $$node_rc = 0 ]

# helm install on a real one-node cluster: the hook Job, probes, a tiny run, cancel, OOM.
k8s-e2e: k8s-images
	$(PY) -m pytest tests/k8s_e2e $(PYTEST_ARGS)

# On a machine with an NVIDIA GPU (docs/gpu.md): NVML readings, the HF baselines (and vLLM
# where installed) on a Qwen3-0.6B-shaped model with random weights built offline, and
# J/token, power and the decode roofline beside published anchors; files under
# ~/.cache/servebench/gpu-check (GPU_CHECK_ARGS="--out DIR" to choose). Without a usable
# GPU it says what is missing and exits non-zero.
gpu-check:
	$(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

run:
	@$(PY) scripts/quickstart.py

# Stops the `make run` of this SERVEBENCH_HOME: its runs' runners, web, worker, beat and the
# embedded PostgreSQL and Redis it started (what it left behind, if it died).
stop:
	@$(PY) scripts/quickstart.py --stop

# Each phase prints its time. The suite runs as pytest sessions grouped by what they cost
# (scripts/suite.py: the one-node cluster's tests, which mostly wait, beside the tests that
# start no vLLM server; then the slow tests alone); each writes a JUnit report that
# bench/test_budget.py reads (the phase against its 30-minute budget, each session, time
# per directory, the slowest tests) and the servers and runner processes it started, per
# module (tests/server_starts.py). The fuzz tests run in the suite's second lane; with
# PYTEST_ARGS the suite is one session, as given, and `make fuzz` follows it.
REPORTS = artifacts/test-reports
test: browser kube k8s-images
	@mkdir -p $(REPORTS)
	@start=$$SECONDS; $(PY) -m ruff check . && $(PY) -m ruff format --check .; rc=$$?; \
	echo "test: phase 'lint' took $$((SECONDS - start)) s"; exit $$rc
	@start=$$SECONDS; $(PY) scripts/suite.py --reports $(REPORTS) \
	  $(if $(PYTEST_ARGS),--one-session) -- $(PYTEST_ARGS); rc=$$?; \
	echo "test: phase 'suite' took $$((SECONDS - start)) s"; \
	$(PY) bench/test_budget.py $(REPORTS)/suite-*.xml --top 10 || true; exit $$rc
	@$(if $(PYTEST_ARGS),start=$$SECONDS; $(MAKE) --no-print-directory fuzz; rc=$$?; \
	echo "test: phase 'fuzz' took $$((SECONDS - start)) s"; exit $$rc,true)

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
	$(PY) bench/hf_overhead.py
	$(PY) bench/telemetry_overhead.py
	$(PY) bench/portal_scale.py
	$(PY) bench/verdict_aa.py
	$(PY) bench/client_capacity.py

clean-dev:
	$(PY) -m portal.devservices stop || true
