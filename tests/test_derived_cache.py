"""What a replay derives from a cached log (traces, trace-driver results) is kept beside its
table cache (``replay_logs.derived``): a warm replay prints what a cold one and an uncached one
print, and a damaged, stale or mismatched file is rebuilt, never used."""

from __future__ import annotations

import json
import math
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.replay_logs import derived, load_log
from gfsim.replay_logs import cache as log_cache
from gfsim.simulator import replay as _replay  # noqa: F401  (loads the module)
from gfsim.worlds.synth import synthesize

replay_mod = sys.modules["gfsim.simulator.replay"]

runner = CliRunner()
# Timings, not results: they differ between any two runs.
_TIMINGS = {"simulation_s"}


@pytest.fixture(scope="module")
def small_log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("derived") / "small.jsonl"
    synthesize(path, seed=7, candidates=1500, tasks=3)
    return path


def _forget_in_process() -> None:
    """Drop what this process keeps, so that the next replay reads the disk (or rebuilds)."""
    replay_mod._TRACES.clear()


def _replay_json(path: Path, *extra: str, env: str = "on") -> dict:
    _forget_in_process()
    old = os.environ.get("GFSIM_LOG_CACHE")
    os.environ["GFSIM_LOG_CACHE"] = env
    try:
        res = runner.invoke(app, ["replay", "--log", str(path), "--policy", "threshold:0.7",
                                  "--json", *extra])
    finally:
        if old is None:
            os.environ.pop("GFSIM_LOG_CACHE", None)
        else:
            os.environ["GFSIM_LOG_CACHE"] = old
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in _TIMINGS:
        out.pop(key, None)
        out.get("baseline", {}).pop(key, None)
    return out


def _derived_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".gfsim-cache/{path.name}.*/derived/*/*.bin"))


def _clear(path: Path) -> None:
    import shutil

    shutil.rmtree(path.parent / ".gfsim-cache", ignore_errors=True)


def test_cold_warm_and_uncached_replays_print_the_same_json(small_log):
    _clear(small_log)
    off = _replay_json(small_log, env="off")
    assert not _derived_files(small_log)
    cold = _replay_json(small_log)
    files = _derived_files(small_log)
    assert {f.name.split("-")[0] for f in files} == {"traces", "replay"}
    stamps = {f: f.stat().st_mtime_ns for f in files}
    warm = _replay_json(small_log)
    assert {f: f.stat().st_mtime_ns for f in _derived_files(small_log)} == stamps  # read only
    assert cold == off
    assert warm == off
    # Another policy, orphans dropped, a budget: each its own kept replay, equal to uncached.
    for extra in (["--policy", "topk:2"], ["--budget", "steps=5"]):
        assert _replay_json(small_log, *extra) == _replay_json(small_log, *extra, env="off")
        assert _replay_json(small_log, *extra) == _replay_json(small_log, *extra, env="off")


def test_a_warm_replay_reads_kept_results_that_equal_fresh_ones(small_log):
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy

    model = load_cost_model("serverless-a100")
    _clear(small_log)
    fresh_log = load_log(small_log)  # not through the cache: nothing kept for it
    _forget_in_process()
    fresh = replay_mod.replay(fresh_log, make_policy("threshold:0.7"), model)
    for _ in range(2):  # the first writes, the second reads
        _forget_in_process()
        kept = replay_mod.replay(load_log(small_log, cache=True), make_policy("threshold:0.7"),
                                 model)
    assert all("_lazy" in r.__dict__ for r in kept.searches)  # came from the disk
    for a, b in zip(fresh.searches, kept.searches):
        assert a.summary() == b.summary() or _nan_equal(a.summary(), b.summary())
        assert a.table == b.table or _nan_equal(a.table, b.table)
        assert np.array_equal(a.anytime, b.anytime)
        assert a.trace_hash == b.trace_hash
    # A kept result pickles (worker processes) and copies as a whole.
    again = pickle.loads(pickle.dumps(kept.searches[0]))
    assert "_lazy" not in again.__dict__ and again.trace_hash == kept.searches[0].trace_hash


def _nan_equal(a, b) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                     default=str)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "swap"])
def test_a_damaged_or_mismatched_file_is_rebuilt(small_log, damage):
    _clear(small_log)
    good = _replay_json(small_log)
    files = _derived_files(small_log)
    assert files
    if damage == "swap":  # another key's file under this key's name: its key does not match
        replays = [f for f in files if f.name.startswith("replay")]
        other = _replay_json(small_log, "--policy", "topk:2")
        new = [f for f in _derived_files(small_log) if f not in files]
        assert new and replays
        replays[0].write_bytes(new[0].read_bytes())
    for f in files:
        blob = bytearray(f.read_bytes())
        if damage == "flip":
            blob[len(blob) * 2 // 3] ^= 0x01  # one bit inside the payload
        elif damage == "truncate":
            blob = blob[: len(blob) // 2]
        elif damage == "garbage":
            blob = bytearray(b"not a derived file")
        if damage != "swap":
            f.write_bytes(bytes(blob))
    assert _replay_json(small_log) == good
    # Rebuilt in place: the files now decode again.
    log = load_log(small_log, cache=True)
    assert derived.source_of(log) is not None
    for f in _derived_files(small_log):
        assert f.read_bytes()[:8] == b"GFSIMDV1"
    if damage == "swap":
        assert _replay_json(small_log, "--policy", "topk:2") == other


def test_kept_traces_are_bound_to_the_code_that_built_them(small_log, monkeypatch):
    _clear(small_log)
    _replay_json(small_log)
    before = set(_derived_files(small_log))
    # Other code (as after an edit of the simulator): another key, so nothing is reused, and
    # what the older code derived is removed when the newer stores.
    monkeypatch.setattr(derived, "code_digest", lambda: "0" * 32)
    _replay_json(small_log)
    after = set(_derived_files(small_log))
    assert len(after) == len(before) and not before & after
    assert not any(f.exists() for f in before)
    assert {f.parent.name for f in after} == {f"{'0' * 32}-{derived.FORMAT}"}


def test_an_edited_log_is_read_again_even_with_its_old_status(tmp_path):
    """The digest remembered by file status is trusted only for the same status: a rewrite
    with the same size and modification time still changes the change time."""
    path = tmp_path / "edit.jsonl"
    synthesize(path, seed=3, candidates=200, tasks=2)
    old = time.time() - 3600
    os.utime(path, (old, old))
    time.sleep(log_cache._RACY_NS / 1e9 + 0.1)  # its change time, too, old enough to trust
    first = load_log(path, cache=True)
    st = os.stat(path)
    assert log_cache.known_digest(path, st) is not None
    raw = path.read_bytes()
    # The same length, another compile time on the first evaluation.
    at = raw.index(b'"compile_s":') + len(b'"compile_s":')
    digit = raw[at:at + 1]
    assert digit.isdigit()
    edited = raw[:at] + (b"1" if digit != b"1" else b"2") + raw[at + 1:]
    path.write_bytes(edited)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old modification time
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert log_cache.known_digest(path, os.stat(path)) is None
    second = load_log(path, cache=True)
    assert not first.evaluations["compile_s"].equals(second.evaluations["compile_s"])
    assert derived.source_of(second)[0] == log_cache._digest(edited)


def test_a_fresh_status_is_not_trusted(tmp_path):
    """A log written less than two seconds before it was hashed could change again within
    its file system's timestamp granularity: its digest is not taken from the memo."""
    path = tmp_path / "fresh.jsonl"
    synthesize(path, seed=3, candidates=100, tasks=2)
    load_log(path, cache=True)
    assert log_cache.known_digest(path, os.stat(path)) is None


def test_a_copy_of_a_cached_log_keeps_nothing():
    import dataclasses

    from gfsim.replay_logs import open_log

    log = open_log(None)
    assert derived.source_of(log) is not None
    assert derived.source_of(dataclasses.replace(log, forecasts=log.forecasts.copy())) is None
    swapped = open_log(None)
    swapped.forecasts = swapped.forecasts.iloc[::-1]
    assert derived.source_of(swapped) is None


def test_the_encoding_keeps_values_and_types():
    shared = [1.5] * 20
    obj = {
        "floats": [0.0, -0.0, math.nan, math.inf, 1e-300, 2.5, 3.0, 4.0, 5.0],
        "ints": list(range(-5, 20)) + [2 ** 62],
        "bools": [True, False] * 10,
        "texts": ["measured", None, "skipped"] * 10,
        "mixed": [1, 2.0, None, "x", True, 3, 4, 5, 6],
        "tuple": (1, (2.0, "a")),
        "scalar": np.float64(1.25),
        "int_scalar": np.int32(7),
        "array": np.arange(12, dtype=np.int16).reshape(3, 4),
        "objects": np.array(["a", None, 1.5], dtype=object),
        "a": shared, "b": shared,
    }
    back = derived.unpack(derived.pack(obj))
    assert back["a"] is back["b"]
    for key, value in obj.items():
        got = back[key]
        assert type(got) is type(value), key
        if isinstance(value, np.ndarray):
            assert got.dtype == value.dtype and got.tolist() == value.tolist()
        elif key == "floats":
            assert [math.copysign(1, x) for x in got] == [math.copysign(1, x) for x in value]
            assert np.array_equal(np.array(got), np.array(value), equal_nan=True)
        else:
            assert got == value and [type(x) for x in _flat(got)] == [type(x) for x in
                                                                       _flat(value)], key
    with pytest.raises(TypeError):
        derived.pack({"x": [np.str_("a")] * 9})
    with pytest.raises(TypeError):
        derived.pack({1: "non-text key"})


def _flat(v):
    if isinstance(v, (list, tuple)):
        for x in v:
            yield from _flat(x)
    else:
        yield v


def test_a_replay_with_nothing_to_keep_leaves_the_shared_lists_unread(small_log, monkeypatch):
    """The lists a kept result would share with its traces (ids, steps, parents per search)
    are read only where a result is read or kept: a million-candidate replay of an uncached
    log built 50 MB of parent lists per search for nothing."""
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy

    calls = []
    real = replay_mod._shared_lists
    monkeypatch.setattr(replay_mod, "_shared_lists", lambda t: calls.append(1) or real(t))
    model = load_cost_model("serverless-a100")
    _forget_in_process()
    replay_mod.replay(load_log(small_log), make_policy("threshold:0.7"), model)
    assert calls == []  # not cached: no file to read or write
    _clear(small_log)
    for _ in range(2):  # the first keeps its results, the second reads them
        _forget_in_process()
        replay_mod.replay(load_log(small_log, cache=True), make_policy("threshold:0.7"), model)
    assert len(calls) == 2
