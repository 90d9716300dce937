"""gfsim: a cost-aware budget simulator and policy optimizer for LLM-driven GPU-kernel searches.

The package is layered; a layer imports only the layers below it (``tests/test_layers.py``
checks the contracts in ``pyproject.toml``'s ``[tool.importlinter]``), from the bottom up:

- ``gfsim.core``: errors, keyed randomness, the spec grammar, the plug-in registries;
- ``gfsim.replay_logs`` (schema, reader, writer) and ``gfsim.cost_models`` (seconds, USD and
  joules of each stage), independent of each other;
- ``gfsim.forecasts``: the forecaster protocol and registry, speedup bins, forecast quality,
  the what-if and learned forecasters;
- ``gfsim.policies`` (which candidates go to the GPU), ``gfsim.importers`` (other tools' logs)
  and ``gfsim.testing`` (building small logs in code; the contract tests a plug-in subclasses);
- ``gfsim.simulator``: traces, the SimPy engine, the fast paths, the PUCT search, budgets;
- ``gfsim.worlds`` (synthetic landscapes and ground truth), ``gfsim.tuning`` (Optuna) and
  ``gfsim.analysis`` (intervals, savings, plots);
- ``gfsim.live``: real forecasts from vLLM and real Triton measurements;
- ``gfsim.integrations``: gfsim inside other tools' searches (a selective surrogate in front of
  an OpenEvolve evaluator, a mutation-operator stand-in for an LLM server);
- ``gfsim.api``: what each command does, as functions returning its results (``gfsim.compare``
  and the names below are importable from ``gfsim`` itself);
- ``gfsim.cli``: the ``gfsim`` command, a thin layer over them.

``replay_logs``, ``cost_models``, ``policies`` and ``simulator`` live in top-level folders of
the repository of the same names; ``gfsim/`` links to them (relative symlinks), so the
checkout imports as the installed package does. Other packages add policies, forecasters, cost
models, worlds and importers by name (``gfsim.core.plugins``; ``docs/how-to/write-a-plugin.md``).
"""

__version__ = "0.1.0"

# The Python API, imported when first used so that ``import gfsim`` stays light:
# gfsim.compare(...) is `gfsim replay`; docs/python-quickstart.md shows the rest.
_API = {
    "compare": "gfsim.api.compare",
    "Comparison": "gfsim.api.compare",
    "tune": "gfsim.api.tune",
    "Tuning": "gfsim.api.tune",
    "savings": "gfsim.api.savings",
    "counterfactual": "gfsim.api.counterfactual",
    "recommend": "gfsim.api.recommend",
    "plan": "gfsim.api.plan",
    "score": "gfsim.api.score",
    "forecast": "gfsim.api.forecast",
    "costs": "gfsim.api.costs",
    "describe_log": "gfsim.api.describe",
    "load_log": "gfsim.replay_logs",
    "make_policy": "gfsim.policies",
    "make_forecaster": "gfsim.forecasts",
    "load_cost_model": "gfsim.cost_models",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'gfsim' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])
