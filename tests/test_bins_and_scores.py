"""docs/concepts/paper.md vectors for bins and selective-prediction scores."""

import math
import subprocess
import sys

import numpy as np
import pytest

from gfsim.core.rng import keyed_uniforms, stream, uniform
from gfsim.forecasts.bins import PAPER_EDGES, REFERENCE_CODE_EDGES, bin_cdf_above, speedup_to_bin
from gfsim.forecasts.confidence import expected_bin_index, maxprob, negentropy, top2_margin


def test_reference_code_bins_match_the_published_vector():
    s = [0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0]
    assert speedup_to_bin(s, "reference-code").tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert speedup_to_bin([0.001, 10000], "reference-code").tolist() == [1, 8]


def test_reference_code_bins_are_closed_on_the_left():
    assert speedup_to_bin(REFERENCE_CODE_EDGES, "reference-code").tolist() == [2, 3, 4, 5, 6, 7, 8]


def test_paper_bins_are_closed_on_the_right():
    assert speedup_to_bin(PAPER_EDGES, "paper").tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert speedup_to_bin([0.1, 0.3, 0.6, 0.9, 1.2, 1.8, 3.0, 5.0], "paper").tolist() == list(
        range(1, 9))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_speedup_without_a_bin_is_an_error(bad):
    with pytest.raises(ValueError):
        speedup_to_bin([bad])


def _peaked(c):
    p = np.full(8, (1 - c) / 7)
    p[4] = c
    return p[None, :]


def test_selective_scores_match_reference_vectors():
    assert maxprob(_peaked(0.7))[0] == pytest.approx(0.7)
    assert top2_margin(_peaked(0.5))[0] == pytest.approx(0.428571, abs=1e-6)
    assert negentropy(np.eye(8)[[2]])[0] == pytest.approx(1.0)
    assert negentropy(np.full((1, 8), 1 / 8))[0] == pytest.approx(0.0, abs=1e-12)
    assert expected_bin_index(np.eye(8)[[0, 7]]).tolist() == [1.0, 8.0]


def test_cdf_above_spreads_mass_log_uniformly_inside_a_bin():
    # Bin 5 of the paper convention is (1.0, 1.41]; its geometric middle splits it in half.
    p = np.eye(8)[[4]]
    mid = math.sqrt(1.0 * 1.41)
    assert bin_cdf_above(p, PAPER_EDGES, [mid])[0] == pytest.approx(0.5)
    assert bin_cdf_above(p, PAPER_EDGES, [0.5])[0] == pytest.approx(1.0)
    assert bin_cdf_above(p, PAPER_EDGES, [2.0])[0] == pytest.approx(0.0)
    # The open top bin uses the stated prior: log-uniform on [4, 4 * top_span].
    top = np.eye(8)[[7]]
    assert bin_cdf_above(top, PAPER_EDGES, [8.0], top_span=4.0)[0] == pytest.approx(0.5)


def test_cdf_above_is_monotone_and_bounded():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(8), size=50)
    thresholds = np.geomspace(0.01, 100, 40)
    values = np.array([bin_cdf_above(p, PAPER_EDGES, np.full(50, t)) for t in thresholds])
    assert np.all(np.diff(values, axis=0) <= 1e-12)
    assert values[0] == pytest.approx(np.ones(50)) and values[-1] == pytest.approx(np.zeros(50))


def test_keyed_streams_depend_only_on_their_key():
    a = stream(7, "task", 3, "noise").random(4)
    b = stream(7, "task", 3, "noise").random(4)
    c = stream(7, "task", 4, "noise").random(4)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    u = keyed_uniforms(1, ["x", "y", "z"], "p")
    assert keyed_uniforms(1, ["z", "x"], "p").tolist() == [u[2], u[0]]
    assert keyed_uniforms(2, ["x"], "p")[0] != u[0]
    assert 0 <= uniform(1, "k") < 1


def test_keyed_draws_are_the_same_in_a_fresh_process(tmp_path):
    # cwd away from the checkout: `python -c` puts cwd first on sys.path, and the source
    # tree's gfsim/ folder would shadow the installed package.
    code = ("from gfsim.core.rng import keyed_uniforms, uniform;"
            "print(repr(uniform(5, 'a', 1)), repr(keyed_uniforms(5, ['c1'], 'r')[0]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.split() == [repr(uniform(5, "a", 1)),
                                  repr(keyed_uniforms(5, ["c1"], "r")[0])]


def test_expected_log2_gain_matches_monte_carlo_and_its_limits():
    from gfsim.forecasts.bins import _log_bounds, expected_log2_gain

    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(8), size=4)
    lo, hi = _log_bounds(PAPER_EDGES, 4.0, 4.0)
    for t in (0.3, 1.0, 1.7, 9.0):
        exact = expected_log2_gain(p, PAPER_EDGES, np.full(4, t))
        bins = np.array([rng.choice(8, size=200_000, p=row) for row in p])
        x = lo[bins] + rng.random(bins.shape) * (hi[bins] - lo[bins])
        mc = np.maximum(x - np.log2(t), 0).mean(axis=1)
        assert exact == pytest.approx(mc, abs=5e-3)
    # A one-hot forecast of a bin entirely above the threshold gains its centre minus t.
    onehot = np.eye(8)[[6]]  # (2, 4]
    assert expected_log2_gain(onehot, PAPER_EDGES, [1.0])[0] == pytest.approx(1.5)
    assert expected_log2_gain(onehot, PAPER_EDGES, [8.0])[0] == 0.0


def test_a_transient_stream_draws_what_its_keyed_stream_draws():
    from gfsim.core.rng import stream, transient_stream

    keys = [(3, "t", "seed/0.1", 2), (0, "x", "seed", 0), (7, "t", "seed/0.1", 2)]
    for _ in range(2):  # the second round restores states seeded in the first
        for key in keys:
            fresh = stream(*key)
            want = (fresh.permutation(20).tolist(), fresh.random(3).tolist())
            reused = transient_stream(*key)
            assert (reused.permutation(20).tolist(), reused.random(3).tolist()) == want


def test_a_keyed_state_is_the_one_numpys_pcg64_sets():
    """``keyed_state`` seeds PCG64 by hand (``_pcg64_seeded``): the same (state, inc) as
    numpy's PCG64 from the same four words, on words with every bit pattern."""
    from gfsim.core.rng import _State, _pcg64_seeded, keyed_state, stream

    rng = np.random.default_rng(8)
    cases = [rng.integers(0, 2**63, 4, dtype=np.uint64) * np.uint64(2)
             + rng.integers(0, 2, 4, dtype=np.uint64) for _ in range(300)]
    cases += [np.zeros(4, np.uint64), np.full(4, 2**64 - 1, dtype=np.uint64)]
    for words in cases:
        st = np.random.PCG64(_State(words)).state["state"]
        assert _pcg64_seeded(words) == (st["state"], st["inc"])
    for n in range(50):
        st = stream(n, "task", f"seed/{n}.1", n).bit_generator.state["state"]
        assert keyed_state(n, "task", f"seed/{n}.1", n) == (st["state"], st["inc"])


def test_a_keyed_stream_is_numpys_seed_sequence_bit_for_bit():
    """``stream`` computes SeedSequence's state itself (a fast path); its generator must be
    the one numpy's ``PCG64(SeedSequence(seed, spawn_key))`` gives, for seeds of one to five
    32-bit words, keys of ints (zero, small, 64-bit) and strings, repeated prefixes (the pool
    it keeps) and empty keys (numpy's own path)."""
    import random

    from gfsim.core.rng import key_words, stream

    rnd = random.Random(11)
    cases = [(0, ()), (0, ("a",)), (5, (0,)), (2**40 + 3, ("x", 2**64 - 1)),
             (2**140, (1, 2, 3, 4, 5)), (100000, ("nk-00", "nk-00-root", 1000005))]
    for _ in range(1500):
        seed = rnd.choice([0, 1, rnd.getrandbits(17), rnd.getrandbits(33), rnd.getrandbits(64),
                           rnd.getrandbits(130)])
        key = tuple(rnd.choice([0, rnd.getrandbits(8), rnd.getrandbits(40), rnd.getrandbits(64),
                                f"s{rnd.getrandbits(6)}", ("t", 1)])
                    for _ in range(rnd.randint(0, 5)))
        cases += [(seed, key), (seed, key + (rnd.getrandbits(20),))]
    for seed, key in cases:
        ref = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            entropy=seed, spawn_key=key_words(*key))))
        got = stream(seed, *key)
        assert got.bit_generator.state == ref.bit_generator.state, (seed, key)
        assert got.standard_normal(3).tolist() == ref.standard_normal(3).tolist()
    with pytest.raises(ValueError):
        stream(-1, "a")
