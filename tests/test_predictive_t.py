"""The predictive intervals' t quantile (issue 53): scipy.stats' own float, without importing
scipy.stats, whose import was a second of every ``gfsim recommend``."""

import subprocess
import sys

import numpy as np
from scipy.stats import t

from gfsim.simulator.predictive import _t


def test_the_t_quantile_is_scipy_stats_own():
    for df in (1, 2, 3, 7, 15, 31, 120):
        for q in np.linspace(0.5, 0.995, 34).tolist():
            assert _t(q, df) == float(t.ppf(q, df))


def test_a_recommendation_does_not_import_scipy_stats(tmp_path):
    code = ("import sys, gfsim\n"
            "gfsim.recommend('synthetic-puct-v1', ['all@2'], seeds=2, fresh_seeds=2,\n"
            "                budget='usd=5', prices=False, jobs=1)\n"
            "print('scipy.stats' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
