"""Inputs that cannot exhaust or fool gfsim: every reader has limits that end in one line naming
the file (size, inflation, line length, file type, a run's own folder), numbers that cannot be
summed are refused by field, a log's strings reach the terminal escaped, and a cache gfsim did
not write is never believed. Each case failed on main 134d1df (a traceback, a hang, memory
without bound, or a wrong number)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError, LogError
from gfsim.replay_logs import load_log, open_log
from gfsim.replay_logs import io as log_io

runner = CliRunner()
TINY = Path(__file__).parent / "data" / "tiny.jsonl"
OPENEVOLVE_RUN = Path(__file__).parent / "data" / "openevolve" / "run"
KT_TINY = Path(__file__).parent / "data" / "kernel_tuner" / "tiny_cache.json"


def records(path: Path = TINY) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


# -- sizes, inflation, file types ----------------------------------------------------------------

def test_a_gzip_bomb_is_refused_before_it_is_held(tmp_path):
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (80 << 20), compresslevel=9))  # 80 KB -> 80 MiB
    with pytest.raises(LogError, match=r"bomb.jsonl.gz: inflates more than 100x .*gzip bomb"):
        load_log(bomb)


def test_an_honest_log_compresses_far_below_the_bomb_ratio():
    from gfsim.replay_logs.shipped import shipped_path

    path = shipped_path("synthetic-puct-v1")
    text = gzip.decompress(path.read_bytes())
    assert len(text) / path.stat().st_size < log_io.MAX_GZIP_RATIO / 5


def test_a_file_above_the_input_limit_is_refused_by_its_size(tmp_path, monkeypatch):
    log = write(tmp_path / "log.jsonl", records())
    monkeypatch.setenv("GFSIM_MAX_INPUT_BYTES", str(log.stat().st_size - 1))
    with pytest.raises(LogError, match=r"log.jsonl: is .* above the .*GFSIM_MAX_INPUT_BYTES"):
        load_log(log)
    gz = tmp_path / "log.jsonl.gz"
    gz.write_bytes(gzip.compress(log.read_bytes()))
    monkeypatch.setenv("GFSIM_MAX_INPUT_BYTES", str(gz.stat().st_size + 10))
    with pytest.raises(LogError, match=r"log.jsonl.gz: inflates to more than"):
        load_log(gz)
    monkeypatch.setenv("GFSIM_MAX_INPUT_BYTES", "lots")
    with pytest.raises(GfsimError, match="GFSIM_MAX_INPUT_BYTES: expected a number"):
        load_log(log)


def test_a_line_longer_than_a_log_may_hold_is_named(tmp_path, monkeypatch):
    recs = records()
    recs[3]["note"] = "x" * 5000
    log = write(tmp_path / "log.jsonl", recs)
    monkeypatch.setattr(log_io, "MAX_LINE_BYTES", 4096)  # (the one reader of lines)
    with pytest.raises(LogError, match=r"log.jsonl:4: line is .* above the"):
        load_log(log)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "proc"])
def test_only_a_regular_file_is_read_as_a_log(tmp_path, kind):
    path = tmp_path / "log.jsonl"
    if kind == "fifo":
        os.mkfifo(path)  # opened for reading, it would block until a writer came
    elif kind == "device":
        path.symlink_to("/dev/zero")  # would never end
    elif kind == "proc":
        path.symlink_to("/proc/self/status")  # 'regular', of size 0, holding what it pleases
    else:
        path.mkdir()
    with pytest.raises(LogError, match="log.jsonl: is (not a regular file|a directory|a "
                       "kernel pseudo-file)"):
        load_log(path)


def test_many_blank_lines_are_not_an_object_each(tmp_path):
    """A split of the text would make an object of every blank line (1 GiB of newlines grew
    past 7 GB); the reader walks them instead, and still numbers lines right."""
    recs = records()
    text = "".join(json.dumps(r) + "\n" for r in recs[:3]) + "\n" * 200_000 + \
        "".join(json.dumps(r) + "\n" for r in recs[3:])
    recs[3]["kind"] = "nonsense"
    bad = "".join(json.dumps(r) + "\n" for r in recs[:3]) + "\n" * 200_000 + \
        "".join(json.dumps(r) + "\n" for r in recs[3:])
    (tmp_path / "ok.jsonl").write_text(text)
    (tmp_path / "bad.jsonl").write_text(bad)
    assert len(load_log(tmp_path / "ok.jsonl").candidates) == len(load_log(TINY).candidates)
    with pytest.raises(LogError, match=r"bad.jsonl:200004: field 'kind'"):
        load_log(tmp_path / "bad.jsonl")


# -- numbers that cannot be summed or represented ------------------------------------------------

def test_probabilities_whose_sum_overflows_are_refused_by_field(tmp_path):
    recs = records()
    at = next(i for i, r in enumerate(recs) if r["kind"] == "forecast")
    recs[at]["probs"] = [1e308] * 8
    log = write(tmp_path / "log.jsonl", recs)
    with pytest.raises(LogError, match=rf"log.jsonl:{at + 1}: field 'probs': .*sum past"):
        load_log(log)
    out = runner.invoke(app, ["replay", "--log", str(log)])
    assert out.exit_code == 2 and "field 'probs'" in out.output
    assert "Traceback" not in out.output


def test_a_kernel_tuner_time_too_large_for_a_double_is_refused_by_field(tmp_path):
    doc = json.loads(KT_TINY.read_text())
    key = next(iter(doc["cache"]))
    text = json.dumps(doc).replace(
        f'"verification_time": {json.dumps(doc["cache"][key]["verification_time"])}',
        '"verification_time": 1' + "0" * 400, 1)
    src = tmp_path / "cache.json"
    src.write_text(text)
    from gfsim.importers.kernel_tuner import import_kernel_tuner

    with pytest.raises(GfsimError, match=r"field 'cache\[.*\]\.verification_time': expected"):
        import_kernel_tuner(src, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


# -- OpenEvolve run folders ----------------------------------------------------------------------

@pytest.fixture
def run(tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(OPENEVOLVE_RUN, dest)
    return dest


def _import(run: Path, out: Path):
    from gfsim.importers.openevolve import import_openevolve

    return import_openevolve(run, out, runtime_metric="runtime_ns", task="softmax",
                             openevolve_version="0.4.1")


def _a_program(run: Path) -> Path:
    return sorted(run.glob("checkpoints/*/programs/*.json"))[0]


def test_a_program_file_nested_too_deep_is_named(run, tmp_path):
    f = _a_program(run)
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(GfsimError, match=rf"{f.name}: JSON nested too deeply"):
        _import(run, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("what", ["zero-log", "fifo-log", "outside-program"])
def test_a_run_folder_reads_only_its_own_regular_files(run, tmp_path, what):
    if what == "zero-log":
        target = run / "logs" / "zero.log"
        target.symlink_to("/dev/zero")  # grew past 4 GB in seconds
        expect = "zero.log: (is not a regular file|leads outside)"
    elif what == "fifo-log":
        target = run / "logs" / "fifo.log"
        os.mkfifo(target)  # blocked the import for ever
        expect = "fifo.log: is not a regular file"
    else:
        f = _a_program(run)
        outside = tmp_path / "elsewhere.json"
        shutil.move(f, outside)
        f.symlink_to(outside)  # was followed and imported
        expect = f"{f.name}: leads outside"
    with pytest.raises(GfsimError, match=expect):
        _import(run, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


# -- what reaches the terminal -------------------------------------------------------------------

def test_a_logs_control_characters_reach_the_terminal_escaped(tmp_path):
    recs = records()
    for r in recs:
        if r["kind"] == "forecast":
            r["forecaster"] = "fc\x1b]0;TITLE\x07\x1b[2J\u202e"
        if r["kind"] == "header":
            r["log_id"] = "id\x1b[31mRED\x9b"
    log = write(tmp_path / "esc.jsonl", recs)
    for args in (["validate", str(log)], ["replay", "--log", str(log)]):
        out = runner.invoke(app, args)
        assert out.exit_code == 0, out.output
        assert not any(c in out.output for c in "\x1b\x07\x9b\u202e"), args
    out = runner.invoke(app, ["validate", str(log)])
    assert r"fc\x1b]0;TITLE\x07\x1b[2J\u202e" in out.output


# -- the cache beside a log ----------------------------------------------------------------------

def _forge(folder: Path, factor: float) -> None:
    """What someone who hands over a log can hand over with it: its cache folder with the
    evaluations' speedups multiplied and the manifest's digests made to match (the seal they
    cannot make)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.feather as feather

    table = feather.read_table(folder / "evaluations.arrow")
    i = table.column_names.index("speedup")
    table = table.set_column(i, "speedup", pc.multiply(table.column("speedup"), factor))
    sink = pa.BufferOutputStream()
    feather.write_feather(table, sink, compression="uncompressed")
    blob = sink.getvalue().to_pybytes()
    (folder / "evaluations.arrow").write_bytes(blob)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tables"]["evaluations"]["sha256"] = hashlib.sha256(blob).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_forged_cache_beside_a_log_is_rebuilt_not_believed(tmp_path):
    log = write(tmp_path / "log.jsonl", records())
    truth = load_log(log).evaluations["speedup"].max()
    open_log(str(log))  # leaves the cache beside the log
    folders = [d for d in (tmp_path / ".gfsim-cache").iterdir() if d.is_dir()]
    assert len(folders) == 1
    _forge(folders[0], 1000.0)
    assert open_log(str(log)).evaluations["speedup"].max() == pytest.approx(truth)
    # a folder sealed by another user's gfsim is not believed either
    env = {**os.environ, "GFSIM_CACHE_DIR": str(tmp_path / "another-user")}
    probe = ("import sys; from gfsim.replay_logs import open_log; "
             "print(open_log(sys.argv[1]).evaluations['speedup'].max())")
    _forge(next(d for d in (tmp_path / ".gfsim-cache").iterdir() if d.is_dir()), 1000.0)
    got = subprocess.run([sys.executable, "-c", probe, str(log)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert float(got.stdout) == pytest.approx(truth)


def test_the_seal_key_is_private_and_made_once(tmp_path, monkeypatch):
    from gfsim.replay_logs import seal

    monkeypatch.setenv("GFSIM_CACHE_DIR", str(tmp_path / "cache"))
    mac = seal.seal(b"tables")
    key = tmp_path / "cache" / "seal.key"
    assert mac is not None and (key.stat().st_mode & 0o777) == 0o600
    assert seal.verify(mac, b"tables") and not seal.verify(mac, b"tables!")
    assert not seal.verify(mac, b"table", b"s")  # parts are length-prefixed
    key.chmod(0o644)  # a key others can read protects nothing: no cache at all
    seal._key_at.cache_clear()
    with pytest.warns(UserWarning, match="not this user's private"):  # said, in one line
        assert seal.seal(b"tables") is None and not seal.available()
    seal._key_at.cache_clear()


def test_an_openevolve_metric_too_large_for_a_double_is_refused_not_a_traceback(run, tmp_path):
    """A 400-digit runtime (an OverflowError in math.isfinite before): read as what a double
    holds, so the program is not a success and the rest imports as a valid log."""
    f = _a_program(run)
    prog = json.loads(f.read_text())
    prog["metrics"]["runtime_ns"] = 0
    f.write_text(json.dumps(prog).replace('"runtime_ns": 0', '"runtime_ns": 1' + "0" * 400, 1))
    _import(run, tmp_path / "out.jsonl")
    log = load_log(tmp_path / "out.jsonl")
    ev = log.evaluations.set_index("candidate_id")
    ok = ev[ev["outcome"] == "success"]["speedup"]
    assert len(ok) and ok.gt(0).all() and ok.lt(float("inf")).all()


def test_a_wrapped_paper_event_nested_too_deep_is_named(tmp_path):
    from gfsim.importers.gpu_forecasters import import_events

    rows = (Path(__file__).parent / "data" / "gpu_forecasters" / "standard_rows.jsonl")
    lines = rows.read_text().splitlines()
    lines[1] = json.dumps({"event_index": 1, "event_kind": "step_started",
                           "payload": "[" * 100_000 + "]" * 100_000})
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(GfsimError, match=r"rows.jsonl:2: the wrapped event is nested too deep"):
        import_events(src, tmp_path / "out.jsonl")
    lines[1] = json.dumps({"event_index": 1, "event_kind": "step_started",
                           "payload": '{"step": 1' + "0" * 400 + "}"})
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(GfsimError, match=r"rows.jsonl:2: the wrapped event: .*64-bit"):
        import_events(src, tmp_path / "out.jsonl")


def test_a_cost_model_file_is_read_within_the_same_limits(tmp_path):
    from gfsim.cost_models import load_cost_model

    fifo = tmp_path / "costs.toml"
    os.mkfifo(fifo)  # read_text() blocked for ever
    with pytest.raises(GfsimError, match="costs.toml: is not a regular file"):
        load_cost_model(str(fifo))
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(GfsimError, match="dir.toml: is a directory"):
        load_cost_model(str(tmp_path / "dir.toml"))


def test_a_log_timed_on_the_cpu_clock_says_so_where_it_is_read(tmp_path):
    recs = records()
    recs[0]["provenance"]["timing_trust"] = "timed on the CPU clock, which a candidate can forge"
    log = write(tmp_path / "cpu.jsonl", recs)
    out = runner.invoke(app, ["validate", str(log)])
    assert out.exit_code == 0 and "UNTRUSTED timings: timed on the CPU clock" in out.output
    out = runner.invoke(app, ["replay", "--log", str(log), "--json"])
    assert any("UNTRUSTED timings" in c for c in json.loads(out.stdout)["log_caveats"])
