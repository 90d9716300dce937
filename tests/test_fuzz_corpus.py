"""The fuzz benchmark's regression corpus (``tests/data/fuzz``): mutants of valid logs, each run
through ``gfsim validate`` and ``gfsim replay`` as ``experiments/fuzz_logs.py`` runs them, in worker
processes with its hang limit. Files named ``--was-crashed--`` or ``--was-misreported--`` crashed
gfsim (or were accepted by ``validate`` and refused by ``replay``) before the fixes of issue 23
(``20261205`` ones: of issue 41); ``--sample--`` files are a fixed draw of every mutation class.
Every one must now pass: no traceback, no hang, no misreport. A small fresh draw of the benchmark
itself runs too (the 10,000-case runs are in docs/experiments/robustness.md)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "data" / "fuzz"


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_logs", ROOT / "experiments" /
                                                  "fuzz_logs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_logs"] = module  # (multiprocessing's spawn finds the worker by name)
    spec.loader.exec_module(module)
    return module


def _run(fuzz, cases, tmp_path) -> list:
    got = []
    pool = fuzz.Pool(2, str(tmp_path))
    try:
        pool.run(cases, lambda case, verdict, detail, replayed: got.append(
            (case["what"], verdict, detail)))
    finally:
        pool.close()
    return got


def test_every_mutant_of_the_regression_corpus_passes(fuzz, tmp_path):
    cases = list(fuzz.corpus_cases(CORPUS))
    assert len(cases) >= 50 and {c["class"] for c in cases} == set(fuzz.CLASSES)
    got = _run(fuzz, cases, tmp_path)
    assert len(got) == len(cases)
    assert [g for g in got if g[1] != "ok"] == []


@pytest.mark.slow
def test_a_small_draw_of_the_benchmark_passes_and_mostly_reaches_replay(fuzz, tmp_path):
    cases = list(fuzz.make_cases(60, 7, fuzz.base_logs()))
    assert sum(all(fuzz._is_json(x) for x in c["data"].decode("utf-8", "replace").splitlines()
                   if x.strip()) for c in cases) >= len(cases) / 2  # most are valid JSON
    got = _run(fuzz, cases, tmp_path)
    assert [g for g in got if g[1] != "ok"] == []


def test_the_judge_counts_a_traceback_and_a_misreport(fuzz):
    assert fuzz.judge([("ok", ""), ("crash", "ValueError at x.py:1")])[0] == "crashed"
    assert fuzz.judge([("ok", ""), ("error", "log.jsonl: bad")])[0] == "misreported"
    assert fuzz.judge([("error", "log.jsonl:3: bad"), ("error", "log.jsonl:3: bad")])[0] == "ok"
    usage = "log.jsonl: policy 'threshold' reads forecasts and the log has none"
    assert fuzz.judge([("ok", ""), ("error", usage)])[0] == "ok"
