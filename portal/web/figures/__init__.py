"""Plotly figure specs (plain dicts) for the run, compare and history pages.

Pages embed them with ``json_script`` and draw them with the locally served plotly.js,
so the figure logic lives here, testable without a browser, and templates stay dumb.
"""

from portal.web.figures.common import esc
from portal.web.figures.compare import compare_figures
from portal.web.figures.history import history_figure
from portal.web.figures.run import (
    latency_figure,
    pareto_figure,
    pareto_front,
    run_figures,
    throughput_figure,
)

__all__ = [
    "compare_figures",
    "esc",
    "history_figure",
    "latency_figure",
    "pareto_figure",
    "pareto_front",
    "run_figures",
    "throughput_figure",
]
