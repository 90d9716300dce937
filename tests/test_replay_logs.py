"""Replay logs: the reader, the writer, the fixtures and the shipped synthetic log.

Broken variants are made from ``tests/data/tiny.jsonl`` in ``tmp_path`` so that each test shows
the one thing it breaks.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import pytest

from gfsim.core.errors import LogError
from gfsim.replay_logs import (
    OUTCOMES,
    PROB_COLUMNS,
    LogWriter,
    TruncatedTailWarning,
    load_log,
    resolve_log,
)
from gfsim.replay_logs import io as log_io

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
TINY = DATA / "tiny.jsonl"
SHIPPED = ROOT / "replay_logs" / "data" / "synthetic-mini.jsonl.gz"


# --- helpers -------------------------------------------------------------------------------

def tiny_records() -> list[dict]:
    return [json.loads(line) for line in TINY.read_text().splitlines() if line.strip()]


def write_lines(path: Path, lines: list[str], final_newline: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def write_records(path: Path, records: list[dict]) -> Path:
    return write_lines(path, [json.dumps(r) for r in records])


def line_of(records: list[dict], kind: str, candidate_id: str | None = None) -> int:
    """0-based index of the first record of ``kind`` (for ``candidate_id``)."""
    for i, r in enumerate(records):
        if r["kind"] == kind and (candidate_id is None or r.get("candidate_id") == candidate_id):
            return i
    raise AssertionError(f"no {kind} record for {candidate_id}")


def gzip_members(path: Path) -> int:
    data, n = path.read_bytes(), 0
    while data:
        d = zlib.decompressobj(wbits=31)
        d.decompress(data)
        assert d.eof, "unexpected cut member"
        data, n = d.unused_data, n + 1
    return n


def expect_log_error(path: Path, line: int, field: str | None) -> LogError:
    with pytest.raises(LogError) as info:
        load_log(path)
    err = info.value
    assert err.path == str(path)
    assert err.line == line
    assert err.field == field
    assert str(path) in str(err) and f":{line}:" in str(err)
    if field is not None:
        assert f"'{field}'" in str(err)
    return err


# --- the tiny fixture ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return load_log(TINY)


def test_tiny_counts(tiny):
    assert tiny.counts == {"header": 1, "run": 2, "step": 4, "candidate": 11, "forecast": 9,
                           "decision": 3, "evaluation": 8}
    assert len(tiny.candidates) == 11 and len(tiny.forecasts) == 9
    assert len(tiny.decisions) == 3 and len(tiny.evaluations) == 8
    assert set(tiny.tasks) == {"alpha", "beta"}
    assert [r["search_id"] for r in tiny.runs] == ["alpha-s0", "beta-s0"]
    assert tiny.forecasters() == ["fixture-fc"]
    assert tiny.is_synthetic and tiny.header["provenance"]["kind"] == "synthetic"


def test_tiny_covers_every_outcome(tiny):
    assert set(tiny.evaluations["outcome"]) == set(OUTCOMES)


def test_tiny_statuses_are_derived(tiny):
    status = dict(zip(tiny.candidates["candidate_id"], tiny.candidates["status"]))
    assert status["a2"] == "generation_failed"
    assert status["a4"] == "deferred"  # a logged decision deferred it; it has no evaluation
    assert status["b3"] == "not_attempted"
    assert {c for c, s in status.items() if s == "evaluated"} == {
        "a0", "a1", "a3", "a5", "b0", "b1", "b2", "b4"}
    assert tiny.status_counts() == {"evaluated": 8, "deferred": 1, "generation_failed": 1,
                                    "not_attempted": 1}


def test_tiny_probs_renormalised_raw_sum_kept(tiny):
    fc = tiny.forecasts.set_index("candidate_id")
    sums = fc.loc[~fc["parse_failed"], PROB_COLUMNS].sum(axis=1)
    assert sums.to_numpy() == pytest.approx([1.0] * len(sums))
    a1 = fc.loc["a1"]
    assert a1["raw_probability_sum"] == pytest.approx(0.9)
    assert list(a1[PROB_COLUMNS]) == pytest.approx([0, 0, 0.2, 0.4, 0.3, 0.1, 0, 0])


def test_tiny_parse_failure_flagged(tiny):
    fc = tiny.forecasts.set_index("candidate_id")
    assert fc["parse_failed"].tolist().count(True) == 1
    a3 = fc.loc["a3"]
    assert a3["parse_failed"]
    assert a3["predicted_bin"] is None or math.isnan(a3["predicted_bin"])
    assert list(a3[PROB_COLUMNS]) == [0.0] * 8


def test_tiny_unknown_field_kept(tiny):
    ev = tiny.evaluations.set_index("candidate_id")
    assert ev.loc["a5", "extra"] == {"gpu_temperature_c": 61}
    assert ev.loc["a0", "extra"] is None


def test_tiny_generation_and_speedups(tiny):
    cand = tiny.candidates.set_index("candidate_id")
    assert cand.loc["a2", "gen_failed_reason"] == "mutator returned no code block"
    assert cand.loc["a3", "parent_id"] == "a0"
    ev = tiny.evaluations.set_index("candidate_id")
    assert ev.loc["b0", "speedup"] == 2.5 and ev.loc["b4", "speedup"] == 0.5
    assert math.isnan(ev.loc["a1", "speedup"])


def test_no_forecasts_fixture():
    log = load_log(DATA / "tiny-no-forecasts.jsonl")
    assert len(log.forecasts) == 0 and log.forecasters() == []
    assert "forecast_bin_edges" not in log.header
    assert log.status_counts()["evaluated"] == 3
    assert list(log.forecasts.columns[-8:]) == PROB_COLUMNS  # empty but well-formed


# --- broken variants: each raises LogError naming file, line and field --------------------

def test_corrupt_middle_line(tmp_path):
    lines = TINY.read_text().splitlines()
    i = line_of(tiny_records(), "candidate", "a3")
    lines[i] = lines[i][: len(lines[i]) // 2]  # cut short, but not the last line
    err = expect_log_error(write_lines(tmp_path / "corrupt.jsonl", lines), i + 1, None)
    assert "not valid JSON" in str(err)


def test_unknown_kind(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "decision", "a4")
    recs[i]["kind"] = "mutation"
    err = expect_log_error(write_records(tmp_path / "kind.jsonl", recs), i + 1, "kind")
    assert "unknown kind 'mutation'" in str(err)


def test_missing_required_field(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "evaluation", "b1")
    del recs[i]["outcome"]
    err = expect_log_error(write_records(tmp_path / "missing.jsonl", recs), i + 1, "outcome")
    assert "missing" in str(err)


def test_forecast_with_seven_probs(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "forecast", "b2")
    recs[i]["probs"] = recs[i]["probs"][:7]
    err = expect_log_error(write_records(tmp_path / "probs7.jsonl", recs), i + 1, "probs")
    assert "expected 8 values, got 7" in str(err)


def test_unknown_parent(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "candidate", "b4")
    recs[i]["parent_id"] = "zz9"
    err = expect_log_error(write_records(tmp_path / "parent.jsonl", recs), i + 1, "parent_id")
    assert "'zz9'" in str(err)


def test_second_header(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "run") + 1
    recs.insert(i, dict(recs[0]))
    err = expect_log_error(write_records(tmp_path / "header2.jsonl", recs), i + 1, "kind")
    assert "second header" in str(err)


def test_speedup_disagrees_with_runtimes(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "evaluation", "b0")
    recs[i]["runtime_ns"] = 1000.0  # 2000 / 1000 = 2.0, but the record says 2.5
    err = expect_log_error(write_records(tmp_path / "speedup.jsonl", recs), i + 1, "speedup")
    assert "disagrees" in str(err)


def test_speedup_within_tolerance_accepted(tmp_path):
    recs = tiny_records()
    i = line_of(recs, "evaluation", "b0")
    recs[i]["runtime_ns"] = 800.5  # 2000 / 800.5 = 2.4984: inside the 1e-3 relative tolerance
    log = load_log(write_records(tmp_path / "ok.jsonl", recs))
    assert len(log.evaluations) == 8


# --- crash safety ----------------------------------------------------------------------------

def test_truncated_tail_dropped_with_warning(tmp_path):
    lines = TINY.read_text().splitlines()
    lines[-1] = lines[-1][:40]  # a crash mid-write: a partial last line, no newline
    path = write_lines(tmp_path / "cut.jsonl", lines, final_newline=False)
    with pytest.warns(TruncatedTailWarning, match=rf"cut\.jsonl:{len(lines)}:"):
        log = load_log(path)
    assert len(log.candidates) == 11
    assert len(log.evaluations) == 7  # b4's evaluation was the cut line
    assert log.candidates.set_index("candidate_id").loc["b4", "status"] == "not_attempted"


def test_complete_last_line_without_newline_is_kept(tmp_path):
    path = write_lines(tmp_path / "nonl.jsonl", TINY.read_text().splitlines(),
                       final_newline=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_log(path).evaluations) == 8


def test_gz_round_trip_in_batches(tmp_path, tiny):
    recs = tiny_records()
    path = tmp_path / "tiny.jsonl.gz"
    with LogWriter(path) as w:
        w.append_many(recs[:10])
        w.append_many(recs[10:25])
        for r in recs[25:]:
            w.append(r)
    assert gzip_members(path) == 2 + len(recs) - 25  # one member per batch
    log = load_log(path)
    assert log.counts == tiny.counts
    assert log.candidates.drop(columns="extra", errors="ignore").equals(
        tiny.candidates.drop(columns="extra", errors="ignore"))
    assert log.evaluations.set_index("candidate_id").loc["a5", "extra"] == {
        "gpu_temperature_c": 61}


def test_gz_cut_in_last_member(tmp_path):
    recs = tiny_records()
    head, tail = recs[:21], recs[21:]  # head: the whole alpha search
    path = tmp_path / "cut.jsonl.gz"
    with LogWriter(path) as w:
        w.append_many(head)
    first = path.stat().st_size
    with LogWriter(path) as w:
        w.append_many(tail)
    full = path.read_bytes()
    # Each cut must warn and keep every record of the first member. Early in the last member
    # nothing of it decompresses; mid-member some whole lines may; in its 8-byte trailer every
    # line decompressed (only the checksum is missing).
    cases = {first + 5: (len(head), len(head)),
             first + (len(full) - first) // 2: (len(head), len(recs) - 1),
             len(full) - 3: (len(recs), len(recs))}
    for cut, (lo, hi) in cases.items():
        path.write_bytes(full[:cut])
        with pytest.warns(TruncatedTailWarning, match="gzip stream ends early"):
            log = load_log(path)
        assert lo <= sum(log.counts.values()) <= hi, cut
        assert set(log.candidates["candidate_id"]) >= {"a0", "a1", "a2", "a3", "a4", "a5"}


def test_writer_appends_and_fsyncs(tmp_path, monkeypatch):
    synced = []
    real_fsync = log_io.os.fsync
    monkeypatch.setattr(log_io.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    recs = tiny_records()
    path = tmp_path / "log.jsonl"
    with LogWriter(path) as w:
        w.append_many(recs[:10])
        assert len(synced) == 2  # the batch, and the new file's directory entry
        # Readable while the writer is still open: append has flushed and synced.
        assert len(path.read_text().splitlines()) == 10
    with LogWriter(path) as w:  # a second writer appends, never truncates
        for r in recs[10:]:
            w.append(r)
    assert len(synced) == 2 + len(recs) - 10  # (the file exists: no directory sync)
    assert load_log(path).counts == load_log(TINY).counts


def test_writer_puts_kind_first(tmp_path):
    path = tmp_path / "k.jsonl"
    with LogWriter(path) as w:
        w.append({"search_id": "s", "driver": "trace", "kind": "run"})
    assert path.read_text() == '{"kind":"run","search_id":"s","driver":"trace"}\n'
    with pytest.raises(ValueError):
        LogWriter(tmp_path / "x.jsonl").append({"search_id": "s"})


def test_gz_writer_is_byte_reproducible(tmp_path):
    recs = tiny_records()
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    for p in (a, b):
        with LogWriter(p) as w:
            w.append_many(recs)
    assert a.read_bytes() == b.read_bytes()
    assert gzip.decompress(a.read_bytes()).decode().count("\n") == len(recs)


# --- the shipped synthetic log -------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    return load_log(resolve_log("synthetic-mini"))


def test_shipped_log_loads_and_says_synthetic(shipped):
    prov = shipped.header["provenance"]
    assert shipped.is_synthetic and prov["kind"] == "synthetic"
    assert "nothing was generated by an LLM or measured on a GPU" in prov["note"]
    assert all(v["label"] == "assumption" for v in prov["assumptions"].values())
    assert shipped.header["hardware"]["device_name"] == "synthetic (no GPU)"
    assert shipped.header["label_bin_convention"] == "reference-code"
    assert shipped.header["forecast_bin_edges"] == [0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0]


def test_shipped_log_shape(shipped):
    cand = shipped.candidates
    assert set(cand["task_id"]) == {"softmax", "layernorm", "matmul"}
    assert 350 <= len(cand) <= 372
    assert (cand.loc[cand["step"] == 0, "parent_id"].isna()).all()
    assert (cand.loc[cand["step"] > 0, "parent_id"].notna()).all()
    # Measure-all: every generated candidate has one forecast and one evaluation.
    generated = cand["gen_failed_reason"].isna()
    assert (cand.loc[generated, "status"] == "evaluated").all()
    assert (cand.loc[~generated, "status"] == "generation_failed").all()
    assert len(shipped.forecasts) == len(shipped.evaluations) == generated.sum()
    assert set(shipped.evaluations["outcome"]) >= {"success", "compile_failed", "incorrect"}
    assert cand["gen_input_tokens"].isna().all()  # mutation tokens are never logged
    fc = shipped.forecasts
    raw = fc.loc[~fc["parse_failed"], "raw_probability_sum"]
    assert raw.between(0.8, 1.1).all()
    assert fc["parse_failed"].sum() >= 1
    steps = [s for s in shipped.steps if s["search_id"] == "softmax-s0"]
    assert [s["step"] for s in steps] == list(range(16))
    assert steps[0]["parent_ids"] == [] and steps[0]["parent_scores"] == []


def test_make_synthetic_mini_reproduces_shipped_bytes(tmp_path):
    out = tmp_path / "regen.jsonl.gz"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "make_synthetic_mini.py"), "--out", str(out)],
        capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "candidates" in proc.stdout
    assert out.read_bytes() == SHIPPED.read_bytes()
    assert gzip_members(out) == 1


def test_make_synthetic_mini_seed_changes_the_world(tmp_path):
    out = tmp_path / "seed1.jsonl.gz"
    subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "make_synthetic_mini.py"), "--out", str(out),
         "--seed", "1"], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.read_bytes() != SHIPPED.read_bytes()
    assert load_log(out).header["provenance"]["seed"] == 1


def test_the_shipped_h200_log_holds_the_measured_code_and_reproduces(tmp_path):
    import hashlib

    from gfsim.replay_logs import open_log, resolve_log
    from gfsim.replay_logs.io import iter_records

    out = tmp_path / "h200.jsonl.gz"
    subprocess.run([sys.executable, str(ROOT / "experiments" / "make_h200_suite.py"), "--out",
                    str(out)], capture_output=True, text=True, check=True, cwd=tmp_path)
    shipped = resolve_log("h200-suite-v0")
    assert out.read_bytes() == shipped.read_bytes()
    log = open_log("h200-suite-v0")
    assert log.header["provenance"]["kind"] == "measured" and log.shape == "pairs"
    assert len(log.candidates) == 24 and len(log.evaluations) == 24
    assert all(t["reference_code"].startswith("# reference for task") for t in log.header["tasks"])
    for _, rec in iter_records(shipped):
        if rec["kind"] == "candidate":
            # The id is the hash of the code that was timed; the code in the log is that code.
            digest = hashlib.sha256(rec["code"].encode()).hexdigest()
            assert rec["code_sha256"] == digest and rec["candidate_id"].endswith(digest[:12])
