"""The world model's compiled draws (simulator._invent_kernel) give the Python loop's children,
to the bit, on SYNTHETIC logs (the landscape's and an NK world's): its PCG64 is numpy's, its
nearest rows are a stable sort's, and whole replays match field by field."""

import math
from dataclasses import replace

import numpy as np
import pytest

from gfsim.cost_models import load_cost_model
from gfsim.core.rng import key_words, keyed_state
from gfsim.policies import make_policy
from gfsim.replay_logs import LogWriter, load_log
from gfsim.simulator import Budget
from gfsim.simulator import world_model as wm
from gfsim.simulator.closed.engine import SEARCH_PRESETS
from gfsim.simulator.replay import replay_many
from gfsim.worlds.nk import NKParams, NKWorld
from gfsim.worlds.synth import build_records
from gfsim.worlds.synth_puct import world_log_records

kernel = pytest.importorskip("gfsim.simulator._invent_kernel")
MODEL = load_cost_model("serverless-a100")


def _generator(state: int, inc: int) -> np.random.Generator:
    gen = np.random.Generator(np.random.PCG64(0))
    gen.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                               "has_uint32": 0, "uinteger": 0}
    return gen


def test_the_kernels_pcg64_draws_numpys_stream():
    rng = np.random.default_rng(3)
    for n in range(60):
        state, inc = keyed_state(int(rng.integers(2**40)), "task", f"seed/{n}.2", n, "model")
        gen = _generator(state, inc)
        assert kernel.raw(wm._state_words(state, inc), 50).tolist() == \
            gen.bit_generator.random_raw(50).tolist()
        # random() and integers(k) mixed: a 32-bit half kept between draws, Lemire's rejection
        # (k near 2^32), ranges of one (no draw)
        gen = _generator(state, inc)
        ks = rng.choice([1, 2, 3, 7, 16, 1000, 2**31 + 11, 2**32 - 1], size=40)
        words = wm._state_words(state, inc)
        got = kernel.mixed(words, ks.astype(np.int64)).tolist()
        assert got == [x for k in ks.tolist() for x in (gen.random(), float(gen.integers(k)))]
        # it goes on from a state numpy left with a half kept (a lineage's permutation first)
        st = gen.bit_generator.state
        words = wm._state_words(st["state"]["state"], st["state"]["inc"], st["has_uint32"],
                                st["uinteger"])
        assert kernel.mixed(words, ks.astype(np.int64)).tolist() == \
            [x for k in ks.tolist() for x in (gen.random(), float(gen.integers(k)))]


def test_the_kernel_seeds_a_keyed_stream_as_numpy_does():
    # SeedSequence(entropy=seed, spawn_key=key_words(*key)) then PCG64, on seeds of one and two
    # 32-bit words, key words of one and two (and 0), keys of one to five parts
    rng = np.random.default_rng(5)
    for n in range(300):
        seed = int(rng.choice([0, 1, int(rng.integers(2**32)), int(rng.integers(2**62))]))
        key = tuple(rng.choice(["task", f"seed/{n}.3", 0, 7, 2**32 + n, 2**64 - 1 - n, "model"],
                               size=int(rng.integers(1, 6))).tolist())
        key = tuple(int(k) if str(k).isdigit() else k for k in key)
        words = np.array(key_words(*key), dtype=np.uint64)
        st = np.random.PCG64(np.random.SeedSequence(entropy=seed, spawn_key=key_words(*key)))
        state = st.state["state"]
        assert kernel.seeded(seed, words).tolist() == \
            wm._state_words(state["state"], state["inc"]).tolist(), (seed, key)


def test_the_kernels_shuffle_is_numpys_permutation():
    rng = np.random.default_rng(4)
    for n in range(80):
        state, inc = keyed_state(n, "task", f"seed/{n}", "lineage")
        gen = _generator(state, inc)
        gen.integers(2 + n % 3)  # sometimes a 32-bit half is kept before the shuffle
        st = gen.bit_generator.state
        words = wm._state_words(st["state"]["state"], st["state"]["inc"], st["has_uint32"],
                                st["uinteger"])
        kids = rng.integers(0, 500, size=int(rng.integers(0, 40))).astype(np.int64)
        want = gen.permutation(kids.tolist()).tolist() if len(kids) else []
        kernel.permute(words, kids)
        assert kids.tolist() == want
        # and the stream goes on from where the shuffle left it
        assert kernel.mixed(words, np.array([7, 1, 3], dtype=np.int64)).tolist() == \
            [x for k in (7, 1, 3) for x in (gen.random(), float(gen.integers(k)))]


def test_the_kernels_nearest_rows_are_a_stable_sorts_first_rows():
    rng = np.random.default_rng(5)
    for case in range(40):
        n = int(rng.integers(1, 120))
        # coarse features: many rows tie; some NaN features (NaN distances sort last)
        feats = np.round(rng.normal(size=(n, 4)) * 2) / 2
        feats[rng.random((n, 4)) < 0.03] = math.nan
        scale = rng.uniform(0.5, 2.0, 4)
        zs = np.round(rng.normal(size=(int(rng.integers(1, 6)), 4)) * 2) / 2
        own = np.flatnonzero(rng.random(n) < rng.uniform(0, 1)).astype(np.int64)
        d = (((feats[None, :, :] - zs[:, None, :]) / scale) ** 2 * wm._WEIGHTS).sum(axis=2)
        want_every = wm._k_smallest_rows(d, np.arange(n))
        want_mine = wm._k_smallest_rows(d[:, own], own)
        k = wm.K_NEAREST
        every = np.empty((len(zs), min(k, n) if n > k else n), dtype=np.int64)
        mine = np.empty((len(zs), min(k, len(own)) if len(own) > k else len(own)),
                        dtype=np.int64)
        kernel.neighbours(feats, scale, wm._WEIGHTS, zs, own, k, every, mine)
        assert every.tolist() == want_every, case
        assert mine.tolist() == want_mine, case


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compiled")
    out = {}
    with LogWriter(folder / "landscape.jsonl") as w:
        w.append_many(build_records(seed=7, candidates=None, tasks=2, driver="puct", steps=10))
    out["landscape"] = load_log(folder / "landscape.jsonl")
    world = NKWorld(NKParams(), 1, 1)  # mutations that often repeat a kernel
    with LogWriter(folder / "nk.jsonl") as w:
        w.append_many(world_log_records(world, seed=2, steps=16, log_id="nk-compiled",
                                        command="test"))
    out["nk"] = load_log(folder / "nk.jsonl")
    return out


def _tables(results) -> list:
    rows = []
    for r in results:
        for s in r.searches:
            rows.append((s.best_speedup, s.wall_s, s.gpu_evals, s.candidates))
            for key in sorted(s.table):
                rows.append((key, [("nan" if isinstance(v, float) and math.isnan(v) else v)
                                   for v in s.table[key]]))
    return rows


@pytest.mark.parametrize("which,children,policy,overgen", [
    ("landscape", "model", "threshold:0.7", 4),
    ("landscape", "fresh", "all", 1),
    ("landscape", "model:gbm", "threshold:0.5", 2),
    ("nk", "model", "threshold:0.7", 4),
    ("nk", "fresh", "threshold:0.3", 2),
    ("nk", "fresh:gbm", "all", 3),
])
def test_compiled_draws_give_the_python_loops_children(logs, monkeypatch, which, children,
                                                       policy, overgen):
    log = logs[which]
    seeds = [0, 1, 2]
    search = replace(SEARCH_PRESETS["paper-standard"], steps=8, overgen=overgen)

    def run():
        return replay_many(log, [make_policy(policy) for _ in seeds], MODEL, seeds,
                           budget=Budget(usd=40), search=search, driver="puct",
                           orphans_dropped=False, children=children)

    monkeypatch.setattr(wm, "COMPILED", False)
    python = run()
    calls = []
    compiled_fn = wm.ModelChildren._compiled

    def counted(self, *args):
        calls.append(1)
        return compiled_fn(self, *args)

    monkeypatch.setattr(wm, "COMPILED", True)
    monkeypatch.setattr(wm, "COMPILE_AFTER", 0)
    monkeypatch.setattr(wm.ModelChildren, "_compiled", counted)
    compiled = run()
    assert calls, "the compiled draws never ran"
    assert sum(len(s.table["candidate_id"]) for r in python for s in r.searches) > 100
    assert _tables(compiled) == _tables(python)


def test_the_kernel_waits_until_the_process_has_drawn_enough_children(monkeypatch):
    monkeypatch.setattr(wm, "_KERNEL", [])
    monkeypatch.setattr(wm, "_DRAWN", [0])
    monkeypatch.setattr(wm, "COMPILE_AFTER", 1000)
    assert wm._kernel() is None and wm._KERNEL == []  # not loaded, not even tried
    wm._DRAWN[0] = 1000
    assert wm._kernel() is kernel


def test_a_kernel_that_cannot_run_leaves_the_python_loop_in_charge(monkeypatch):
    monkeypatch.setattr(wm, "_KERNEL", [])
    monkeypatch.setattr(wm, "_DRAWN", [10**9])

    def broken(*args):
        raise RuntimeError("this machine's LLVM cannot compile it")

    monkeypatch.setattr(kernel, "invent", broken)
    assert wm._kernel() is None and wm._KERNEL == [None]
