"""Ablation (dev seeds): the model's lineage + forecast shift, but draws from the fallback's bin pool."""
import json, sys

from gfsim.simulator import children as C
from gfsim.simulator.children import LogChildren

def _bin_nearest(self, pool, node_speedup, n, used, rng):
    return LogChildren._fallback(pool, node_speedup, n, used, rng)

C.ModelChildren._nearest = _bin_nearest
from gfsim.worlds.benchmark import BenchSpec, run_benchmark
from gfsim.worlds.family import world_names, world_seeds
spec = BenchSpec(children="model")
names = world_names()[int(sys.argv[2]):int(sys.argv[3])]
out = run_benchmark(names, world_seeds("dev", 6), spec, jobs=1)
json.dump({"worlds": out}, open(sys.argv[1], "w"))
