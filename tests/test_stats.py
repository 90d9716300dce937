"""--seeds: bootstrap intervals over tasks then seeds, paired with the baseline."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.analysis.stats import NOTE, SeedTable, summarize_seeds
from gfsim.cli.main import app

runner = CliRunner()


def table(rng, n_seeds=6, n_tasks=4, shift=0.0):
    values = {m: rng.lognormal(0, 0.3, (n_seeds, n_tasks)) + shift
              for m in ("best_speedup", "usd", "wall_s", "joules", "gpu_evals")}
    return SeedTable(list(range(n_seeds)), [f"t{j}" for j in range(n_tasks)], values)


def test_a_policy_compared_with_itself_has_a_zero_delta():
    t = table(np.random.default_rng(0))
    s = summarize_seeds(t, t)
    for e in s["overall"].values():
        assert e["delta"]["mean"] == 0 and e["delta"]["lo"] == 0 == e["delta"]["hi"]
        assert e["delta"]["includes_zero"]
    assert s["note"] == NOTE


def test_intervals_contain_the_estimate_and_are_reproducible():
    rng = np.random.default_rng(1)
    a, b = table(rng, shift=0.5), table(rng)
    s1, s2 = summarize_seeds(a, b, seed=3), summarize_seeds(a, b, seed=3)
    assert s1 == s2
    for e in s1["overall"].values():
        for side in ("policy", "baseline", "delta"):
            assert e[side]["lo"] <= e[side]["mean"] <= e[side]["hi"]
    # A clear shift of every value is a delta whose interval excludes zero.
    assert not s1["overall"]["usd"]["delta"]["includes_zero"]
    best = s1["overall"]["best_speedup"]["policy"]["mean"]
    expected = np.exp(np.log(a.values["best_speedup"]).mean(axis=1)).mean()
    assert best == pytest.approx(expected)


def test_pairing_removes_what_both_sides_share():
    rng = np.random.default_rng(2)
    base = table(rng, n_seeds=8)
    noisy = SeedTable(base.seeds, base.tasks, {m: v * 1.01 for m, v in base.values.items()})
    s = summarize_seeds(noisy, base)
    width = s["overall"]["usd"]["delta"]["hi"] - s["overall"]["usd"]["delta"]["lo"]
    side = s["overall"]["usd"]["policy"]["hi"] - s["overall"]["usd"]["policy"]["lo"]
    assert width < side / 10


def test_cli_seeds_report_intervals_with_their_meaning():
    res = runner.invoke(app, ["replay", "-p", "random:0.5", "--driver", "puct", "--seeds", "3",
                              "--jobs", "2", "--json"])
    assert res.exit_code == 0, res.output
    iv = json.loads(res.output)["intervals"]
    assert iv["seeds"] == 3 and "resample one log" in iv["note"]
    assert set(iv["overall"]) == {"best_speedup", "usd", "wall_s", "joules", "gpu_evals"}
    assert set(iv["per_task"]) == set(iv["tasks"])
