"""servebench's command-line client: submit benchmarks to a servebench portal, wait for
them, compare a run with a baseline and gate CI on a noise-aware verdict.

An HTTP client of the REST API only (``servebench.client``); it never imports Django, so
it runs in any CI image with ``requests`` (and ``pydantic`` + ``pyyaml`` for the offline
``validate``, which uses the runners' spec model).

    servebench submit spec.yaml --wait --compare-to latest:main
    python -m servebench compare BASE CANDIDATE --markdown
"""

__version__ = "0.1.0"
