"""Bad input, thrown by hypothesis at the importers and the log reader: always a one-line
``GfsimError`` naming the file (and line, where the format has lines), never another exception,
never a partial output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfsim.core.errors import GfsimError
from gfsim.importers.kernel_tuner import import_kernel_tuner
from gfsim.replay_logs import load_log
from gfsim.testing import LogBuilder

DATA = Path(__file__).parent / "data" / "kernel_tuner"
SETTINGS = settings(max_examples=int(os.environ.get("GFSIM_HYPOTHESIS_EXAMPLES", "60")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])



def one_line_error(exc: GfsimError, path: Path) -> None:
    msg = str(exc)
    assert "\n" not in msg and msg.startswith(str(path)), msg


def _paths(doc, prefix=()):
    """Every (path of keys) in a JSON document."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(doc, path, action, value):
    if not path:
        return value if action == "replace" else doc
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@SETTINGS
@given(data=st.data(), fname=st.sampled_from(["tiny_cache.json", "tiny_t4.json"]))
def test_kernel_tuner_importer_never_crashes(tmp_path_factory, json_values, data, fname):
    tmp = tmp_path_factory.mktemp("kt")
    doc = json.loads((DATA / fname).read_text())
    paths = _paths(doc)
    path = data.draw(st.sampled_from(paths))
    action = data.draw(st.sampled_from(["replace", "delete"]))
    value = data.draw(json_values)
    doc = _mutate(doc, path, action, value)
    src = tmp / fname
    raw = json.dumps(doc).encode()
    tail = data.draw(st.sampled_from([b"", b"\xff\xfe", b"}", b"\n{"]))
    cut = data.draw(st.integers(min_value=0, max_value=len(raw)))
    src.write_bytes(raw[:cut] + tail if data.draw(st.booleans()) else raw + tail)
    out = tmp / "out.jsonl"
    try:
        import_kernel_tuner(src, out)
    except GfsimError as exc:
        one_line_error(exc, src)
        assert not out.exists()
    else:
        load_log(out)  # whatever was accepted is a valid log


def _small_log(tmp: Path) -> Path:
    b = LogBuilder({"t": 1.0})
    a = b.candidate("t", 0, probs=LogBuilder.onehot(5), speedup=1.5)
    b.candidate("t", 1, parent=a, probs=LogBuilder.onehot(6), speedup=2.0)
    b.candidate("t", 1, parent=a, outcome="compile_failed", speedup=None)
    return b.write(tmp / "log.jsonl")


@SETTINGS
@given(data=st.data())
def test_the_log_reader_names_the_line_of_any_bad_record(tmp_path_factory, json_values, data):
    tmp = tmp_path_factory.mktemp("log")
    path = _small_log(tmp)
    lines = path.read_bytes().splitlines()
    i = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    kind = data.draw(st.sampled_from(["bytes", "json", "field", "drop_field"]))
    if kind == "bytes":
        lines[i] = data.draw(st.binary(min_size=1, max_size=20))
    elif kind == "json":
        lines[i] = json.dumps(data.draw(json_values)).encode()
    else:
        rec = json.loads(lines[i])
        key = data.draw(st.sampled_from(sorted(rec)))
        if kind == "drop_field":
            del rec[key]
        else:
            rec[key] = data.draw(json_values)
        lines[i] = json.dumps(rec).encode()
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        load_log(path)
    except GfsimError as exc:
        one_line_error(exc, path)
        assert str(exc).startswith(f"{path}:") or "empty log" in str(exc)


# -- found by experiments/fuzz_logs.py -----------------------------------------------------------
def _run(args):
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})  # no wrap inside a long tmp path


def test_a_search_of_two_tasks_is_refused_by_validate_naming_line_and_field(tmp_path):
    b = LogBuilder({"t": 1.0, "u": 1.0})
    b.candidate("t", 0, speedup=1.5)
    b.candidate("u", 0, speedup=1.2)
    b.records[-2]["search_id"] = "s-t"  # u's candidate in t's search
    path = b.write(tmp_path / "mixed.jsonl")
    line = 1 + next(i for i, r in enumerate(b.records, start=1)
                    if r["kind"] == "candidate" and r["task_id"] == "u")
    for loader in ("fast", "validating"):
        with pytest.raises(GfsimError, match=rf":{line}: field 'task_id': search 's-t' is for "
                           "task 't'"):
            if loader == "fast":
                load_log(path)
            else:
                from gfsim.replay_logs.log import _validating_columns
                from gfsim.replay_logs.io import _read_bytes

                _validating_columns(str(path), _read_bytes(path))
    res = _run(["validate", str(path)])
    assert res.exit_code == 2 and "one task per search" in res.output


def test_a_log_without_candidates_is_refused_by_replay_in_one_line(tmp_path):
    b = LogBuilder()
    path = b.write(tmp_path / "empty.jsonl")
    assert _run(["validate", str(path)]).exit_code == 0  # a valid log, if an empty one
    res = _run(["replay", "--log", str(path), "--policy", "all"])
    assert res.exit_code == 2
    assert res.output.strip() == f"gfsim: error: {path}: the log holds no candidates: " \
        "nothing to replay"


def test_json_nested_beyond_the_fast_readers_depth_is_one_line(tmp_path):
    path = _small_log(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(2, '{"kind":' + "[" * 5000 + "]" * 5000 + "}")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(GfsimError) as exc:
        load_log(path)
    one_line_error(exc.value, path)
    assert f"{path}:3:" in str(exc.value)


MARKUP = {"t": "[/b]alpha", "f": "[/]fc[link=x]", "gpu": "[/i]gpu"}


def test_names_that_look_like_rich_markup_are_printed_as_they_are(tmp_path):
    b = LogBuilder({MARKUP["t"]: 1.0}, device_name=MARKUP["gpu"])
    a = b.candidate(MARKUP["t"], 0, probs=LogBuilder.onehot(5), speedup=1.5)
    b.candidate(MARKUP["t"], 1, parent=a, probs=LogBuilder.onehot(6), speedup=2.0)
    b.candidate(MARKUP["t"], 1, parent=a, probs=LogBuilder.onehot(3), speedup=0.4)
    for r in b.records:
        if r["kind"] == "forecast":
            r["forecaster"] = MARKUP["f"]
    path = b.write(tmp_path / "[bold]markup.jsonl")
    out = {}
    for cmd in (["validate", str(path)], ["score", "--log", str(path), "--by-task"],
                ["replay", "--log", str(path)], ["savings", "--log", str(path), "--seeds", "2"]):
        res = _run(cmd)
        assert res.exit_code == 0, (cmd, res.output, res.exception)
        out[cmd[0]] = " ".join(res.output.split())
    assert MARKUP["t"] in out["validate"] and MARKUP["f"] in out["validate"]
    assert str(path.name) in out["validate"]
    assert MARKUP["f"] in out["score"] and MARKUP["t"] in out["score"]


def test_esc_cuts_long_strings_and_keeps_undecodable_bytes_printable():
    from gfsim.cli.common import esc

    assert esc("n" * 500, 20) == "n" * 19 + "\u2026"
    assert esc("[/b]") == "\\[/b]"
    assert esc("a\udcffb") == "a\\udcffb"  # a path's undecodable byte (surrogateescape)


def test_an_error_message_is_one_printable_line_whatever_it_quotes(tmp_path):
    from gfsim.cli.common import one_line

    assert one_line("a\nb\rc") == "a\\nb\\rc"
    assert one_line("bad \udcff byte") == "bad \\udcff byte"
    long = one_line("x" * 100_000, limit=2000)
    assert len(long) < 2100 and "98,000 characters cut" in long
    b = LogBuilder()
    b.candidate("t", 0, speedup=1.5)
    b.records[-1]["candidate_id"] = "n" * 100_000  # an evaluation of an unknown candidate
    path = b.write(tmp_path / "long.jsonl")
    res = _run(["validate", str(path)])
    assert res.exit_code == 2 and len(res.output) < 2200 and res.output.count("\n") == 1


def test_an_import_whose_records_json_cannot_hold_leaves_nothing(tmp_path):
    from gfsim.importers.common import write_validated

    b = LogBuilder()
    b.candidate("t", 0, speedup=1.5)
    b.records[-1]["compile_s"] = float("nan")
    out, src = tmp_path / "out.jsonl", tmp_path / "source.json"
    with pytest.raises(GfsimError) as exc:
        write_validated([b.header, *b.records], out, src)
    one_line_error(exc.value, src)
    assert "cannot be written as a log" in str(exc.value)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its .partial
