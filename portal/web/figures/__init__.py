"""Plotly figure specs (plain dicts) for the run, compare and history pages.

Pages embed them with ``json_script`` and draw them with the locally served plotly.js
(the basic bundle: scatter traces only), so the figure logic lives here, testable
without a browser, and templates stay dumb. Shared pieces are in ``common``; the rules
the charts draw (Pareto front, best point within a budget) are in
``portal.benchmarks.points``.
"""

from portal.web.figures.common import chart, esc
from portal.web.figures.compare import compare_figures
from portal.web.figures.history import history_figure
from portal.web.figures.run import (
    RunCharts,
    latency_figure,
    pareto_figure,
    rates_figure,
    run_figures,
    server_figure,
    throughput_figure,
)

__all__ = [
    "RunCharts",
    "chart",
    "compare_figures",
    "esc",
    "history_figure",
    "latency_figure",
    "pareto_figure",
    "rates_figure",
    "run_figures",
    "server_figure",
    "throughput_figure",
]
