"""The portal's HTML pages, one module per area (runs, compare, history, tokens)."""

from portal.web.views import compare, history, runs, tokens

__all__ = ["compare", "history", "runs", "tokens"]
