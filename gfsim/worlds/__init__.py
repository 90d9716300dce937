"""Synthetic worlds that stand in for a real search: the keyed speedup landscape
(``landscape``), the logs ``gfsim synth`` writes from it (``synth``, ``synth_puct``), the
landscape run directly as ground truth for what a replay claims (``counterfactual``) and a replica
of the paper's evaluation set (``replica``). Every number here is SYNTHETIC and says so. It builds
on the simulator, policies, cost models and forecasts; it must not import tuning, the CLI or
live mode.
"""
