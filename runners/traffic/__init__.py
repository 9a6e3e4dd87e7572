"""Production traffic: trace replay (``traces``), multi-turn sessions (``sessions``), the
client that sends them with vLLM's request functions and metric definitions (``client``)
and the correctness of the answers under that load (``correctness``)."""
