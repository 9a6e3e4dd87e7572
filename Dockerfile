# syntax=docker/dockerfile:1
# servebench images, two targets from one file (docs/kubernetes.md: "Deploy"):
#
#   docker build --target portal -t REGISTRY/servebench-portal:0.1.0 .
#   docker build --target runner -t REGISTRY/servebench-runner:0.1.0-vllm0.32.0 .
#
# The bases are build arguments: the tests build the same file from bases made on the
# machine (scripts/build-images.sh: a debootstrapped Debian bookworm as PYTHON_IMAGE, vLLM's
# CPU build as VLLM_IMAGE) and run both images on a one-node cluster (tests/k8s_e2e).
#
# portal: the web app (gunicorn, the default command); the same image runs the Celery
#         worker and beat with another command (the Helm chart and k8s/ do).
# runner: the official vLLM image plus runners/ (ENTRYPOINT python -m runners); the
#         Kubernetes executor starts it as `python -m runners run /spec/spec.json ...`.
# tests/k8s/test_dockerfile.py checks what can be checked without a Docker engine.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Pinned: vLLM's CLI, metrics and bench client change between releases, and the runner's
# environment capture records this version next to every number.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

# --------------------------------------------------------------------------- portal
FROM ${PYTHON_IMAGE} AS portal

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=portal.settings \
    WEB_CONCURRENCY=3

WORKDIR /app
RUN groupadd --system --gid 10001 servebench \
 && useradd --system --uid 10001 --gid servebench --home-dir /app --shell /usr/sbin/nologin servebench

# Dependencies first: this layer is reused until requirements/portal.txt changes.
COPY requirements/portal.txt requirements/portal.txt
RUN pip install --no-cache-dir -r requirements/portal.txt

COPY manage.py ./
COPY runners/ runners/
# The CLI's package: the portal imports its verdict engine and statistics (one each).
COPY servebench/ servebench/
COPY portal/ portal/

# Static files (hashed, compressed) are collected at build time. The settings that have
# no default get throwaway values: collectstatic reaches no database and no broker.
RUN SECRET_KEY=collectstatic-only-this-is-not-a-secret-key-0000 \
    DATABASE_URL=postgres://build@localhost/build \
    REDIS_URL=redis://localhost:6379/0 \
    SERVEBENCH_PUBLIC_URL=http://localhost \
    python manage.py collectstatic --noinput --verbosity 0

USER 10001:10001
EXPOSE 8000

# /healthz answers 200 when the database does. It is asked with the public host name, the
# one ALLOWED_HOSTS accepts (Kubernetes probes set the same Host header).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.parse as p, urllib.request as r; host = p.urlsplit(os.environ.get('SERVEBENCH_PUBLIC_URL', 'http://localhost')).netloc; r.urlopen(r.Request('http://127.0.0.1:8000/healthz', headers={'Host': host}), timeout=4)"]

# Workers: WEB_CONCURRENCY. Worker: celery -A portal.celery worker --loglevel INFO
# Beat (exactly one): celery -A portal.celery beat --schedule /tmp/celerybeat-schedule
CMD ["gunicorn", "portal.wsgi:application", "--bind", "0.0.0.0:8000", "--worker-tmp-dir", "/dev/shm", "--no-control-socket", "--access-logfile", "-", "--forwarded-allow-ips", "*"]

# --------------------------------------------------------------------------- runner
FROM ${VLLM_IMAGE} AS runner

# vLLM's image already has everything runners/ imports (pydantic, PyYAML, requests,
# psutil, nvidia-ml-py, torch, transformers); the build fails here if that ever changes.
WORKDIR /opt/servebench
COPY runners/ runners/
ENV PYTHONPATH=/opt/servebench \
    PYTHONUNBUFFERED=1
RUN command -v python >/dev/null 2>&1 || ln -s "$(command -v python3)" /usr/local/bin/python; \
    python -c "import pydantic, yaml, requests, psutil, pynvml, vllm" \
 && python -m runners schema >/dev/null

ENTRYPOINT ["python", "-m", "runners"]
CMD ["--help"]
