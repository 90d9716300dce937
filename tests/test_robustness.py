"""Bad input, thrown by hypothesis at the importers and the log reader: always a one-line
``GfsimError`` naming the file (and line, where the format has lines), never another exception,
never a partial output."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfsim.core.errors import GfsimError
from gfsim.importers.kernel_tuner import import_kernel_tuner
from gfsim.replay_logs import load_log
from gfsim.testing import LogBuilder

DATA = Path(__file__).parent / "data" / "kernel_tuner"
SETTINGS = settings(max_examples=int(__import__("os").environ.get("GFSIM_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
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
