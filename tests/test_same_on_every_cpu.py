"""Figures that must not depend on which SIMD code numpy picks for this CPU (AVX-512's exp and
log differ from the others' in the last bit): a tuning trial's value, which Optuna's sampler
then reads, so that one bit sent the rest of a study elsewhere on another machine. (The world
model's draws have their own such test in test_child_batches.py.)"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gfsim.tuning.trials import aggregate

CODE = ("import json, sys, numpy as np; from gfsim.tuning.trials import aggregate; "
        "rng = np.random.default_rng(11); "
        "from gfsim.core.libm import exp; "
        "blocks = [exp(rng.normal(0.5, 0.7, (32, 6))) for _ in range(200)]; "
        "print(json.dumps([aggregate('best_speedup', b).hex() for b in blocks]))")


def _simd_targets() -> list[str]:
    from numpy._core._multiarray_umath import __cpu_dispatch__

    return [f for f in ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR") if f in __cpu_dispatch__]


def test_a_trials_value_is_the_same_with_numpys_simd_turned_off(tmp_path):
    off = _simd_targets()
    if not off:
        pytest.skip("this numpy dispatches to no SIMD target that can be turned off")
    # Run from elsewhere: a checkout's gfsim/ folder would shadow a regular install (CI's).
    runs = [subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path,
                           env={**os.environ, "NPY_DISABLE_CPU_FEATURES": disabled})
            for disabled in ("", " ".join(off))]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert json.loads(runs[0].stdout) == json.loads(runs[1].stdout)


def test_the_geometric_mean_is_the_numpy_one_to_the_last_bits():
    rng = np.random.default_rng(2)
    for _ in range(50):
        block = np.exp(rng.normal(0.3, 1.0, (8, 5)))
        want = float(np.exp(np.log(block).mean(axis=1)).mean())
        assert aggregate("best_speedup", block) == pytest.approx(want, rel=1e-14)
