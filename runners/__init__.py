"""servebench runners: the part that touches GPUs, usable without the portal.

    python -m runners run spec.yaml --out result.json

This package never imports Django; it talks to the portal over HTTP only
(``runners.report``), so the same command works on any GPU box.
"""

__version__ = "0.1.0"
