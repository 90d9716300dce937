"""A hard dollar cap over a whole run (gfsim.integrations.cap; issue 55, item 3): the ledger
reserves work in flight, refuses what would pass the cap and stays reached. Inside a real
OpenEvolve 0.4.1 run: tests/test_openevolve_surrogate.py."""

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from gfsim.core.errors import GfsimError
from gfsim.integrations.cap import CapReached, DollarCap


def _records(cap: DollarCap) -> list[dict]:
    return [json.loads(line) for line in Path(cap.ledger).read_text().splitlines()]


def test_work_in_flight_counts_and_a_refusal_stops_everything_after_it(tmp_path):
    cap = DollarCap(1.0, tmp_path / "ledger.jsonl", gpu_usd_per_hour=3600.0)  # $1 a second
    a = cap.reserve("evaluation", 0.4, "a")
    b = cap.reserve("proposal", 0.4, "b")  # 0.8 in flight
    with pytest.raises(CapReached, match=r"\$0.8000 in flight"):
        cap.reserve("forecast", 0.3, "c")
    cap.settle(a, 0.1, seconds=0.1)
    cap.settle(b, 0.1)
    st = cap.status()
    assert st["spent_usd"] == pytest.approx(0.2) and st["in_flight_usd"] == 0
    assert st["settled"]["evaluation"] == pytest.approx(0.1)
    # $0.8 are left now, but the cap was reached: nothing starts any more
    with pytest.raises(CapReached):
        cap.reserve("proposal", 0.01)
    assert [r["kind"] for r in _records(cap)].count("reached") == 1
    assert st["reached"]["what"] == "forecast"
    assert cap.eval_usd(0.5) == pytest.approx(0.5)
    assert cap.eval_reservation() == pytest.approx(0.1)  # the longest evaluation so far


def test_bad_caps_and_a_foreign_ledger_are_refused(tmp_path):
    for bad in (0, -1, float("inf")):
        with pytest.raises(GfsimError, match="usd must be"):
            DollarCap(bad, tmp_path / "l.jsonl")
    with pytest.raises(GfsimError, match=">= 0"):
        DollarCap(1.0, tmp_path / "l.jsonl", gpu_usd_per_hour=-1)
    other = tmp_path / "other.jsonl"
    other.write_text("not json\n")
    with pytest.raises(GfsimError, match="other.jsonl:1"):
        DollarCap(1.0, other).status()


def _grab(args) -> int:
    cap, n = args
    got = 0
    for _ in range(n):
        try:
            ticket = cap.reserve("evaluation", 1.0)
        except CapReached:
            break
        cap.settle(ticket, 1.0, seconds=1.0)
        got += 1
    return got


def test_processes_sharing_a_cap_never_pass_it(tmp_path):
    cap = DollarCap(15.0, tmp_path / "ledger.jsonl")
    with mp.get_context("fork").Pool(4) as pool:  # (spawn cannot import this test file)
        got = pool.map(_grab, [(cap, 10)] * 4)
    assert sum(got) == 15
    assert cap.status()["spent_usd"] == pytest.approx(15.0)
