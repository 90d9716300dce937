"""gfsim from Python: what each command does, as functions that return the results the commands
print (``gfsim.compare`` is ``gfsim replay``). Also importable from ``gfsim`` itself::

    import gfsim

    log = gfsim.load_log("synthetic-mini")          # a path or a shipped log's name
    c = gfsim.compare(log, "threshold:0.7")          # beside measuring every candidate
    c.best_speedup, c.usd_delta, c.to_dict()         # what `gfsim replay --json` prints
    t = gfsim.tune(log, "threshold", ["tau=0.3:0.95"], trials=20)   # `gfsim tune`

docs/python-quickstart.md walks through it.
"""

from gfsim.api.compare import Comparison, compare
from gfsim.api.counterfactual import counterfactual
from gfsim.api.forecast import forecast
from gfsim.api.plan import plan
from gfsim.api.recommend import recommend
from gfsim.api.savings import savings
from gfsim.api.score import score
from gfsim.api.tune import Tuning, tune

__all__ = ["compare", "Comparison", "tune", "Tuning", "savings", "counterfactual",
           "recommend", "plan", "score", "forecast"]
