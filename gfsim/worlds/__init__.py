"""Worlds that stand in for a real search, and what gfsim learns by running on them.

A world (``protocol``: the ``World`` protocol, ``--world`` specs; ``conformance``: the test every
world must pass) has tasks and a keyed tree of mutations with the records a log would hold. The
built-in ones: the SYNTHETIC speedup landscape (``landscape``), an NK world (``nk``) and Kernel
Tuner caches of real measurements (``kernel_tuner``), sharing ``kit``; the frozen family of the
counterfactual benchmark (``family``). On them: the logs ``gfsim synth`` writes (``synth``,
``synth_puct``), the direct runs a replay is checked against (``counterfactual``, ``benchmark``:
``gfsim counterfactual``) and a replica of the paper's evaluation set (``replica``). Every
synthetic number says so. It builds on the simulator, policies, cost models, forecasts and
importers; it must not import tuning, the CLI or live mode.
"""
