"""gfsim: a cost-aware budget simulator and policy optimizer for LLM-driven GPU-kernel searches.

The package is one namespace assembled from the repository's top-level folders:
``gfsim.replay_logs`` (schema, reader, writer), ``gfsim.cost_models``, ``gfsim.policies``,
``gfsim.simulator`` and the application layer here (CLI, bins, keyed randomness).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
