"""Batched child draws (``ChildSource.draw_step``) and the fast paths of the world model's
children (issue 39): the same draws as one ``draw`` per expansion, and as the code before the
fast paths, on the shipped trajectory logs.

Golden digests: ``GOLDEN`` holds, per (log, children, seed), the sha256 of every child that
``_drive`` draws, recorded from the code before these fast paths (commit f05fb05) by this
file's ``_digest``; a change of any draw (child, id, speedup, forecast, outcome) fails it."""

import dataclasses
import hashlib
import math

import numpy as np
import pytest
from gfsim.cost_models import load_cost_model
from gfsim.replay_logs import open_log
from gfsim.simulator.children import (
    _EDGES_LOG2,
    LogChildren,
    shift_probs,
    shift_probs_rows,
)
from gfsim.simulator.replay import cached_traces
from gfsim.simulator.world_model import _Draws, _draws_agree, ModelChildren, world_model

MODEL = load_cost_model("serverless-a100")
LOGS = ("synthetic-puct-v1", "h200-live-v1", "h200-costmodel-all")


def _numpy_shift(probs, delta_log2, edges_log2=None):
    """shift_probs as it was written in numpy (before the Python-float form)."""
    if delta_log2 == 0 or not math.isfinite(delta_log2):
        return probs
    cdf = np.zeros(len(probs) + 1)
    np.cumsum(probs, out=cdf[1:])
    total = cdf[-1]
    if not total > 0:
        return probs
    edges = _EDGES_LOG2 if edges_log2 is None else edges_log2
    extended = np.concatenate([[edges[0] - 1.0], edges, [edges[-1] + 1.0]])
    at = np.empty(len(probs) + 1)
    at[0], at[-1] = 0.0, total
    at[1:-1] = np.interp(edges - delta_log2, extended, cdf)
    out = np.diff(at)
    np.maximum(out, 0.0, out=out)
    return out


def _cases(n, seed=1):
    rng = np.random.default_rng(seed)
    for trial in range(n):
        p = rng.dirichlet(np.ones(8) * rng.choice([0.1, 1.0, 5.0]))
        if trial % 7 == 0:
            p[rng.integers(8, size=3)] = 0.0
        if trial % 11 == 0:
            p = np.zeros(8)  # a failed parse
        d = float(rng.choice([rng.normal(0, 2), rng.normal(0, 0.05), 0.5 * rng.integers(-3, 4),
                              0.0, math.inf, 25.0, -25.0]))
        edges = None if trial % 3 else np.sort(rng.normal(0, 1.5, 7))
        if trial % 13 == 0:  # a moved edge lands exactly on a closed edge
            e = _EDGES_LOG2 if edges is None else edges
            xp = np.concatenate([[e[0] - 1], e, [e[-1] + 1]])
            d = float(e[rng.integers(7)] - xp[rng.integers(9)])
        yield p, d, edges


def test_shift_probs_gives_numpys_floats_bit_for_bit():
    for p, d, edges in _cases(6000):
        want, got = _numpy_shift(p, d, edges), shift_probs(p, d, edges)
        assert isinstance(got, np.ndarray)
        assert want.tobytes() == got.tobytes(), (p, d, edges)
    p = np.array([0, 0, 0, 1.0, 0, 0, 0, 0])
    assert shift_probs(p, 0.0) is p and shift_probs(np.zeros(8), 1.0).sum() == 0


def test_shift_probs_rows_gives_shift_probs_row_for_row():
    cases = list(_cases(3000, seed=2))
    for edges in (None, np.sort(np.random.default_rng(3).normal(0, 1.5, 7))):
        rows = [(p, d) for p, d, e in cases if (e is None) == (edges is None)]
        probs = np.array([p for p, _ in rows])
        delta = np.array([d for _, d in rows])
        got = shift_probs_rows(probs, delta, edges)
        for (p, d), row in zip(rows, got):
            assert np.array_equal(row, _numpy_shift(p, d, edges))
            assert row.tobytes() == np.asarray(_numpy_shift(p, d, edges)).tobytes()


def test_draws_are_the_generators_own():
    assert _draws_agree()
    rng = np.random.default_rng(7)
    for s in range(400):
        a, b = np.random.default_rng([s, 9]), np.random.default_rng([s, 9])
        if s % 2:  # a permutation first leaves half an output buffered
            m = int(rng.integers(0, 12))
            assert a.permutation(m).tolist() == b.permutation(m).tolist()
        d = _Draws(b)
        for _ in range(30):
            if rng.random() < 0.4:
                assert float(a.random()) == d.random()
            else:
                k = int(rng.choice([1, 2, 3, 16, 17, 1000, 2**31 + 3, 2**32 - 1]))
                assert int(a.integers(k)) == d.integers(k)


# --- draws on the shipped logs --------------------------------------------------------------

def _source(trace, children, traces):
    if children == "fallback":
        return LogChildren(trace)
    return ModelChildren(trace, world_model(traces, children.partition(":")[2]))


def _drive(source, seed, steps=14, batched=False):
    """A search-like sequence of steps: each step expands 1-3 nodes drawn so far (the seed
    first), 1-12 children each; every child is returned, in order, as a tuple of its fields
    (floats as hex, the forecast as bytes)."""
    rng = np.random.default_rng([seed, 77])
    root, s0 = source.root()
    nodes, expanded, drawn = [(root, s0)], {}, []
    for _ in range(steps):
        k = min(len(nodes), int(rng.integers(1, 4)))
        picks = sorted(set(rng.choice(len(nodes), size=k, replace=False).tolist()))
        requests = []
        for i in picks:
            node_id, s = nodes[i]
            e = expanded.get(node_id, 0)
            expanded[node_id] = e + 1
            requests.append((node_id, s, e, int(rng.integers(1, 13))))
        outs = source.draw_step(requests, seed) if batched else \
            [source.draw(*r, seed) for r in requests]
        for kids in outs:
            for c in kids:
                drawn.append(_fields(c))
                if c.speedup == c.speedup and c.speedup > 0 and not c.gen_failed:
                    nodes.append((c.candidate_id, float(c.speedup)))
    return drawn


def _fields(c):
    out = []
    for k, v in sorted((f.name, getattr(c, f.name)) for f in dataclasses.fields(c)):
        if k == "probs":
            v = np.asarray(v, dtype=float).tobytes().hex()
        elif isinstance(v, (float, np.floating)):
            v = float(v).hex() if v == v else "nan"
        out.append((k, repr(v)))
    return tuple(out)


def _digest(drawn) -> str:
    return hashlib.sha256(repr(drawn).encode()).hexdigest()


@pytest.fixture(scope="module")
def traces():
    return {name: cached_traces(open_log(name), MODEL, None) for name in LOGS}


@pytest.mark.parametrize("children", ["model:crb", "model:gbm", "fallback"])
@pytest.mark.parametrize("name", LOGS)
def test_draw_step_draws_what_draw_draws(traces, name, children):
    ts = traces[name]
    for seed in (0, 3):
        for t in ts[:2]:
            one = _drive(_source(t, children, ts), seed)
            batched = _drive(_source(t, children, ts), seed, batched=True)
            assert len(one) > 20
            assert one == batched


GOLDEN = {  # (log, children, seed): sha256 of the drawn children, from f05fb05; crb's
    # from issue 39's CPU-independent neighbours (stable sort, the C library's log2)
    ('synthetic-puct-v1', 'model:crb', 0):
        'ece0b19d5bab30e0a9f193a8be6b6b6ff258f59e820ab903489e59154d05ad20',
    ('synthetic-puct-v1', 'model:crb', 3):
        '873fc659330808b8b4ecb00c7ef1cb1b5b87f4445da97ce215b415e93a38e5cd',
    ('synthetic-puct-v1', 'model:gbm', 0):
        'e5a469eddbbdf9f1d94b02bc5de16e0762dc1a2f5494b00e6a25d4e172ed1958',
    ('synthetic-puct-v1', 'model:gbm', 3):
        '9be12296bcdb7645890d9091319e2c45dd8754bc0372fc7f12a7019dc44385f7',
    ('synthetic-puct-v1', 'fallback', 0):
        '43e1278a604c03a7aa23eb056dadef2a58423dfc8efad3eacddb200e92eb5fe6',
    ('synthetic-puct-v1', 'fallback', 3):
        '8a9fd4d9b02d240e024e6ff1b1635b149b6774742cb9b23f5cc8571f4f3a314f',
    ('h200-live-v1', 'model:crb', 0):
        'afb4ecdd7ad4c806d1b87f5e18c55da7257a139c0907ac67d9882d83950e73ce',
    ('h200-live-v1', 'model:crb', 3):
        '6ee220d837c273a9ca509ad39186c67a0c86f955074a28c6897e78291d2b5e4f',
    ('h200-live-v1', 'model:gbm', 0):
        '0ce99c9994dc87e610eec4d2dfe363558ef86c0097d99ce2098f393f1b9f83f5',
    ('h200-live-v1', 'model:gbm', 3):
        '00c0462e7cbe7e8f4b437a736d0b396882ddb86e796e586f2e9fce4b8cd326bf',
    ('h200-live-v1', 'fallback', 0):
        'bc9ddfdd04150c7b016e2306eb5a4178d90fd15b7a3f32a44f08bc69ed8837ce',
    ('h200-live-v1', 'fallback', 3):
        '29f25d4fb3c2db1b228b10e0172784f1deafa578cc65caf5187d7ec3b18ce0ca',
    ('h200-costmodel-all', 'model:crb', 0):
        'fe101f7b2f58598cffeafae319427031150e84486988a1f9480b26d9ec47b421',
    ('h200-costmodel-all', 'model:crb', 3):
        '39239a993ec4953319d875ce40b1c02c327745b969f76a44ba08913ca5ef4054',
    ('h200-costmodel-all', 'model:gbm', 0):
        'ba684009594fceaf28d84b846886b1068faf00e9c01b1ecb7103129a0f9b1b49',
    ('h200-costmodel-all', 'model:gbm', 3):
        '4ad8834c4d0e7b609d926f3d7ff4968d0fedb666ea748adbab08ac4d8b97fbad',
    ('h200-costmodel-all', 'fallback', 0):
        '595c44ee5d9672a9c479424859d3f8182b98f380e9645e39e2586c93e5080106',
    ('h200-costmodel-all', 'fallback', 3):
        '12632284a05fb2d72f87d39857afe46d33bf5f6b9c19b6fb5fb1371a2a8d626a',
}


@pytest.mark.parametrize("children", ["model:crb", "model:gbm", "fallback"])
@pytest.mark.parametrize("name", LOGS)
def test_draws_are_the_ones_drawn_before_the_fast_paths(traces, name, children):
    ts = traces[name]
    for seed in (0, 3):
        t = ts[0]
        got = _digest(_drive(_source(t, children, ts), seed, batched=True))
        assert got == _digest(_drive(_source(t, children, ts), seed))
        assert got == GOLDEN[(name, children, seed)], (name, children, seed)


@pytest.mark.parametrize("children", ["model:crb", "model:gbm"])
def test_forecasts_moved_in_one_array_call_are_the_same(traces, children, monkeypatch):
    """A step with many moved forecasts moves them with shift_probs_rows: forced here."""
    from gfsim.simulator import world_model as wm

    monkeypatch.setattr(wm, "_ROWS_AT_ONCE", 1)
    ts = traces["synthetic-puct-v1"]
    got = _digest(_drive(_source(ts[0], children, ts), 0, batched=True))
    assert got == GOLDEN[("synthetic-puct-v1", children, 0)]


def test_draws_do_not_depend_on_the_cpus_simd(traces, tmp_path):
    """numpy runs other SIMD code for some functions where the CPU has AVX-512 (or AVX2),
    with results that differ in the last bit or, for argpartition, in which tied rows come
    first; the same draws must come out with that dispatch turned off."""
    import json
    import os
    import subprocess
    import sys

    from numpy._core._multiarray_umath import __cpu_dispatch__

    off = [f for f in ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR") if f in __cpu_dispatch__]
    if not off:
        pytest.skip("this numpy dispatches to no SIMD target that can be turned off")
    cases = [("synthetic-puct-v1", "model:crb", 0), ("h200-live-v1", "model:gbm", 0),
             ("h200-costmodel-all", "model:crb", 0)]
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_child_batches as T; "
            "from gfsim.replay_logs import open_log; "
            "from gfsim.simulator.replay import cached_traces; out = []\n"
            "for name, ch, seed in json.loads(sys.argv[2]):\n"
            "    ts = cached_traces(open_log(name), T.MODEL, None)\n"
            "    out.append(T._digest(T._drive(T._source(ts[0], ch, ts), seed, batched=True)))\n"
            "print(json.dumps(out))")
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(off)}
    # Run from elsewhere: a checkout's gfsim/ folder would shadow a regular install (CI's).
    got = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__),
                          json.dumps(cases)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    want = [_digest(_drive(_source(traces[n][0], ch, traces[n]), s, batched=True))
            for n, ch, s in cases]
    assert json.loads(got.stdout.strip().splitlines()[-1]) == want


def test_fresh_children_are_all_invented_and_keyed_by_the_seed(traces):
    """--children fresh: the world model invents every child, the logged ones too; the same
    seed draws the same search, another seed another one."""
    ts = traces["synthetic-puct-v1"]
    model = world_model(ts, "crb")
    fresh = [_drive(ModelChildren(ts[0], model, fresh=True), seed, batched=True)
             for seed in (0, 0, 1)]
    anchored = _drive(ModelChildren(ts[0], model), 0, batched=True)
    sources = {dict(f)["draw_source"] for f in fresh[0]}
    assert sources == {"'model'"}
    assert "'own'" in {dict(f)["draw_source"] for f in anchored}
    assert fresh[0] == fresh[1] and fresh[0] != fresh[2]
