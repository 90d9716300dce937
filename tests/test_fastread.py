"""The fast reader and the columnar cache: the same tables as the validating reader, the same
one-line errors, and a cache that is never trusted when the log's bytes change."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfsim.core.errors import LogError
from gfsim.replay_logs import cache as log_cache
from gfsim.replay_logs import load_log, open_log
from gfsim.replay_logs import log as L
from gfsim.replay_logs.io import decompress, read_raw
from gfsim.replay_logs.shipped import SHIPPED_LOGS, shipped_path
from gfsim.testing import LogBuilder

TABLES = ("candidates", "forecasts", "decisions", "evaluations", "forecast_errors")


def assert_same_log(a, b):
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert (a.header, a.runs, a.steps, a.counts) == (b.header, b.runs, b.steps, b.counts)


def readers(path):
    """(fast reader's log or None if it declined, validating reader's log or its LogError)."""
    raw = read_raw(Path(path))
    data, cut = decompress(Path(path), raw)
    fast = None if cut else L._fast_columns(str(path), data)
    try:
        slow = L._build(str(path), L._validating_columns(str(path), (data, cut)))
    except LogError as exc:
        slow = exc
    return (None if fast is None else L._build(str(path), fast)), slow


def small_log(tmp_path, name="log.jsonl"):
    b = LogBuilder({"t0": 1.2, "t1": 1.0})
    a = b.candidate("t0", 0, speedup=1.5, probs=b.onehot(5, 0.7))
    b.candidate("t0", 1, parent=a, outcome="compile_failed", speedup=None,
                probs=b.onehot(2, 0.5), gen_s=3.0)
    b.candidate("t0", 1, parent=a, speedup=2.5, probs=None, tokens=None)
    b.candidate("t1", 0, outcome=None, deferred=True, probs=b.onehot(4))
    b.candidate("t1", 0, gen_failed=True)
    b.candidate("t1", 0, parse_failed=True, speedup=0.8)
    b.records.append({"kind": "decision", "candidate_id": "t1-0006", "policy": "p",
                      "action": "measure", "score": 3, "reason": "r"})
    b.records.append({"kind": "forecast", "candidate_id": "t0-0001", "forecaster": "g",
                      "mode": "tool", "probs": [0] * 8, "error": "no answer"})
    b.records.append({"kind": "step", "search_id": "s-t0", "step": 1, "parent_ids": ["t0-0001"],
                      "parent_scores": [1.5]})
    return b.write(tmp_path / name)


@pytest.mark.parametrize("name", sorted(SHIPPED_LOGS))
def test_both_readers_give_the_same_tables_of_each_shipped_log(name):
    fast, slow = readers(shipped_path(name))
    if fast is not None:  # logs with fields beyond the schema go to the validating reader
        assert_same_log(fast, slow)
    assert_same_log(load_log(shipped_path(name)), slow)


def test_the_fast_reader_takes_a_plain_log(tmp_path):
    fast, slow = readers(small_log(tmp_path))
    assert fast is not None
    assert_same_log(fast, slow)
    assert slow.forecast_errors["error"].tolist() == ["no answer"]


MUTATIONS = ("delete", "insert", "replace_value", "add_field", "drop_field", "duplicate_line",
             "swap_lines", "blank_line", "no_final_newline", "two_on_a_line")
ODD_VALUES = ['NaN', 'Infinity', '-Infinity', '1e400', str(2**64), str(2**63), '-' + str(2**63),
              '1' * 5000, '"\\ud800"', '"\\udc00x"', '"\\ud83d\\ude00"', '""', 'null', 'true',
              '1.0', '-1', '0', '[]', '{}', '"x"', '9', '1.5e-310']


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_whatever_the_fast_reader_accepts_the_validating_one_accepts_alike(tmp_path, data,
                                                                           json_values):
    path = small_log(tmp_path, "base.jsonl")
    lines = path.read_text().splitlines()
    op = data.draw(st.sampled_from(MUTATIONS))
    i = data.draw(st.integers(1, len(lines) - 1))  # the header (line 1) stays as it is
    rec = json.loads(lines[i])
    if op == "delete" or op == "insert":
        text = lines[i]
        k = data.draw(st.integers(0, len(text) - 1))
        lines[i] = text[:k] + (data.draw(st.sampled_from(list('{}[]",:0a '))) if op == "insert"
                               else "") + text[k + (op == "delete"):]
    elif op in ("replace_value", "add_field"):
        key = data.draw(st.sampled_from(sorted(rec)) if op == "replace_value"
                        else st.sampled_from(["extra", "step", "seq", "probs", "score", "x"]))
        raw = data.draw(st.sampled_from(ODD_VALUES) | json_values.map(json.dumps))
        rec.pop(key, None)
        body = json.dumps(rec)[:-1]
        lines[i] = body + (", " if rec else "") + json.dumps(key) + ": " + raw + "}"
    elif op == "drop_field" and len(rec) > 1:
        rec.pop(data.draw(st.sampled_from(sorted(k for k in rec if k != "kind") or ["kind"])))
        lines[i] = json.dumps(rec)
    elif op == "duplicate_line":
        lines.insert(i, lines[i])
    elif op == "swap_lines" and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif op == "blank_line":
        lines.insert(i, data.draw(st.sampled_from(["", "  ", "\t"])))
    elif op == "two_on_a_line":
        lines[i] = lines[i] + " " + lines[i]
    text = "\n".join(lines) + ("" if op == "no_final_newline" else "\n")
    mutated = tmp_path / "mutated.jsonl"
    mutated.write_text(text, encoding="utf-8", errors="surrogatepass")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast, slow = readers(mutated)
    if fast is not None:
        assert not isinstance(slow, LogError), f"the fast reader took what the validating " \
            f"one rejects: {slow}"
        assert_same_log(fast, slow)


@pytest.mark.parametrize("value, message", [
    ("NaN", "NaN is not a JSON number"), ("Infinity", "Infinity is not a JSON number"),
    ("1e400", "out of range for a double"), (str(2**64), "outside the 64-bit range"),
    ("1" * 5000, "outside the 64-bit range"),
])
def test_unrepresentable_numbers_are_one_line_errors(tmp_path, value, message):
    path = small_log(tmp_path)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-1] + f', "extra_number": {value}}}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError, match=message) as err:
        load_log(path)
    assert f"{path}:3:" in str(err.value) and "\n" not in str(err.value)


def test_a_lone_surrogate_is_an_error_naming_its_field(tmp_path):
    path = small_log(tmp_path)
    lines = path.read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if json.loads(ln)["kind"] == "candidate")
    rec = json.loads(lines[k])
    rec["generation"]["failed_reason"] = "PLACEHOLDER"
    lines[k] = json.dumps(rec).replace("PLACEHOLDER", "bad \\udcff text")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError, match="lone surrogate") as err:
        load_log(path)
    assert err.value.line == k + 1 and err.value.field == "generation.failed_reason"
    # A proper pair is text: the same escape with its partner loads.
    path.write_text(path.read_text().replace("\\udcff", "\\ud83d\\ude00"))
    assert load_log(path).candidates["gen_failed_reason"].notna().any()


# -- the cache ---------------------------------------------------------------------------------
def cached_folder(path):
    digest = log_cache._digest(read_raw(Path(path)))
    return next((f for f in log_cache.cache_dir_for(path, digest) if f.exists()), None)


def test_a_second_load_reads_the_cache_and_equals_a_fresh_one(tmp_path, monkeypatch):
    path = small_log(tmp_path)
    first = load_log(path, cache=True)
    folder = cached_folder(path)
    assert folder is not None and folder.parent == tmp_path / ".gfsim-cache"

    def no_parsing(*_):
        raise AssertionError("parsed although the cache was valid")

    monkeypatch.setattr(L, "_fast_columns", no_parsing)
    monkeypatch.setattr(L, "_validating_columns", no_parsing)
    again = load_log(path, cache=True)
    assert_same_log(again, first)
    assert again.path == str(path)


def test_editing_one_byte_invalidates_the_cache(tmp_path):
    path = small_log(tmp_path)
    load_log(path, cache=True)
    old = cached_folder(path)
    text = path.read_text()
    assert '"speedup": 2.5' in text or '"speedup":2.5' in text
    path.write_text(text.replace("2.5", "2.6", 1))  # same length: one byte differs
    log = load_log(path, cache=True)
    assert 2.6 in log.evaluations["speedup"].tolist()
    assert not old.exists() and cached_folder(path) is not None  # replaced, not kept beside


def test_a_damaged_cache_is_ignored_and_replaced(tmp_path):
    path = small_log(tmp_path)
    fresh = load_log(path, cache=True)
    folder = cached_folder(path)
    (folder / "candidates.arrow").write_bytes(b"not arrow at all")
    assert_same_log(load_log(path, cache=True), fresh)
    (folder / "manifest.json").write_text("{")
    assert_same_log(load_log(path, cache=True), fresh)


def test_a_folder_it_cannot_write_beside_sends_the_cache_to_the_user_cache(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("GFSIM_CACHE_DIR", str(tmp_path / "user"))
    path = small_log(tmp_path)
    (tmp_path / ".gfsim-cache").write_text("a file where the cache folder would go")
    fresh = load_log(path, cache=True)
    folder = cached_folder(path)
    assert folder is not None and folder.parent == tmp_path / "user" / "logs"
    assert_same_log(load_log(path, cache=True), fresh)


def test_shipped_logs_cache_in_the_user_cache_and_caching_can_be_turned_off(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("GFSIM_CACHE_DIR", str(tmp_path / "user"))
    log = open_log("synthetic-mini")
    assert log.label == "synthetic-mini"
    folder = cached_folder(shipped_path("synthetic-mini"))
    assert folder is not None and folder.parent == tmp_path / "user" / "logs"
    assert not (shipped_path("synthetic-mini").parent / ".gfsim-cache").exists()
    monkeypatch.setenv("GFSIM_LOG_CACHE", "off")
    path = small_log(tmp_path)
    load_log(path, cache=True)
    assert cached_folder(path) is None


def test_cached_free_form_values_come_back_as_they_were(tmp_path):
    b = LogBuilder({"t": 1.0})
    b.candidate("t", 0, speedup=1.5, probs=b.onehot(5))
    b.records[-1]["imputed_by"] = {"compile_s": "prior", "n": [1, 2.5, None, True]}
    b.records[-1]["custom"] = {"nested": {"x": 10**18}}
    path = b.write(tmp_path / "odd.jsonl")
    fresh = load_log(path)
    load_log(path, cache=True)
    again = load_log(path, cache=True)
    assert_same_log(again, fresh)
    assert again.evaluations["imputed_by"].iloc[0] == {"compile_s": "prior",
                                                       "n": [1, 2.5, None, True]}
    assert again.evaluations["extra"].iloc[0] == {"custom": {"nested": {"x": 10**18}}}
    assert isinstance(np.asarray(again.evaluations["speedup"])[0], np.floating)


def test_a_gzip_log_of_many_members_reads_as_its_plain_text(tmp_path):
    # A live log appends one gzip member per batch; the reader is linear in them.
    import gzip

    plain = small_log(tmp_path)
    lines = plain.read_bytes().splitlines(keepends=True)
    many = tmp_path / "many.jsonl.gz"
    many.write_bytes(b"".join(gzip.compress(line, mtime=0) for line in lines)
                     + b"\x00" * 8)  # padding after the last member, as some writers leave
    assert_same_log(load_log(many), load_log(plain))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(many.read_bytes()[:-30])
    with pytest.warns(UserWarning, match="gzip stream ends early"):
        shorter = load_log(cut)
    assert len(shorter.candidates) <= len(load_log(plain).candidates)


@pytest.mark.parametrize("raw", ['{"": 9223372036854775808}', '{"": -99999999999999999999}',
                                 '{"": [1, 9223372036854775808]}', '{"": 1e400}',
                                 '{"": -1e999}'])
def test_a_number_out_of_range_under_an_unknown_key_is_refused_by_both_readers(tmp_path, raw):
    """A candidate's generation holding, under a key no struct knows, an integer past 64 bits
    or a float past a double: the validating reader refuses it, and the fast reader (whose
    structs skip what they do not know, unchecked) must not take it (found by the property
    test above with '{"": 9223372036854775808}')."""
    path = small_log(tmp_path, "base.jsonl")
    lines = path.read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if json.loads(x)["kind"] == "candidate")
    rec = json.loads(lines[i])
    rec.pop("generation", None)
    lines[i] = json.dumps(rec)[:-1] + ', "generation": ' + raw + "}"
    mutated = tmp_path / "mutated.jsonl"
    mutated.write_text("\n".join(lines) + "\n")
    fast, slow = readers(mutated)
    assert isinstance(slow, LogError) and ("out of range" in str(slow) or "64-bit" in str(slow))
    assert fast is None
